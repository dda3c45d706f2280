"""An output formatter (one token id a line) that fails for some prompts: at once, or after a few tokens."""

from djl_python.output_formatter import output_formatter


@output_formatter
def fragile(output) -> str:
    prompt = output.input.input_text
    if "fail now" in prompt:
        raise ValueError("cannot format this one")
    if "fail later" in prompt and len(output.sequences[0].tokens) >= 3:
        raise RuntimeError("gave up after three tokens")
    return "".join(f"{t.id}\n" for t in output.sequences[0].new_tokens)
