"""Test doubles for AWS: moto's server on loopback, and the AWS event-stream encoding."""
