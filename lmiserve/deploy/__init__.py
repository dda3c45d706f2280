"""Deployment to Amazon SageMaker real-time endpoints (``lmiserve deploy``, ``lmiserve invoke``).

Nothing here is imported by the server; boto3 is needed only by these commands (``lmiserve[deploy]``).
"""
