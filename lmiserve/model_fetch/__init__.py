"""Fetching the model a user names from where they keep it: a Hugging Face Hub repository or an
S3 prefix, into a local directory the rest of lmiserve reads as any other.

Downloads are resumable (a file is written under a temporary name, with a record of the ranges
already fetched, and renamed once complete and verified), shared between processes (one downloads
under a lock while the others wait, then find the files in place) and reported (bytes, rate and
ETA in the log; :data:`progress.DOWNLOADED_BYTES` for ``/metrics``). Nothing here imports torch.
"""

from .errors import FetchError
from .fetch import FetchOptions, fetch_model, is_remote

__all__ = ["FetchError", "FetchOptions", "fetch_model", "is_remote"]
