"""The settings of the pictures (and other media) requests send: where they may come from, how
many a prompt may hold and how long a fetch may take. Their values are read by
:class:`lmiserve.media.MediaPolicy`, which refuses a malformed one when the model loads."""

from __future__ import annotations

from .fields import Area, optional_setting, setting


class MediaSettings(Area):
    """Media in requests (vision-language models)."""

    allowed_media_domains: str | None = optional_setting(
        "option.allowed_media_domains",
        "Hosts whose http(s) URLs a request may name for an image, as vLLM names the setting: a comma-separated "
        'list or a JSON list; ".example.com" takes every host below example.com. A host named here may be '
        "private or loopback. Empty: any host whose addresses are all public.",
    )
    allowed_local_media_path: str | None = optional_setting(
        "option.allowed_local_media_path",
        "A directory on the server whose files (and only those) a request may name by path or file:// URL, as "
        "MindIE's image_url allows and vLLM names the setting. Empty: local paths are refused.",
    )
    limit_mm_per_prompt: str | None = optional_setting(
        "option.limit_mm_per_prompt",
        'Most media parts of each kind in one prompt, LMI\'s JSON: {"image": 2}. Every request holds at most '
        "20 media parts (MindIE's limit) whatever this says.",
    )
    media_fetch_timeout: float = setting(
        10.0,
        "option.media_fetch_timeout",
        "Seconds one media URL may take: name resolution, connecting and the whole body.",
        gt=0,
    )
    media_allow_redirects: bool = setting(
        False,
        "option.media_allow_redirects",
        "Follow an http redirect of a media URL (each hop is checked like the first); off: a redirect is refused.",
    )
    media_allow_private_addresses: bool = setting(
        False,
        "option.media_allow_private_addresses",
        "Fetch media URLs whose hosts resolve to private, loopback or link-local addresses; off: only hosts named "
        "in option.allowed_media_domains may.",
    )
