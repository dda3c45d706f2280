"""Configuration: ``serving.properties`` + environment + CLI flags -> typed, validated settings."""

from .loader import ConfigError, Settings, Source, load_settings
from .schema import ModelSettings, ServerSettings

__all__ = ["ConfigError", "ModelSettings", "ServerSettings", "Settings", "Source", "load_settings"]
