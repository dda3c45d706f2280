"""lmiserve: an LLM serving container in the style of SageMaker / DJL Serving LMI."""

__version__ = "0.1.0"
