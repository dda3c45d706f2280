class EngineGenerateError(Exception):
    """A request failed inside the engine (the engine goes on)."""


class EngineDeadError(Exception):
    """The engine core is gone."""

    def __init__(self, *args: object) -> None:
        super().__init__("EngineCore encountered an issue.", *args)
