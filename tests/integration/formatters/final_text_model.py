"""Only the final text, as plain text: nothing is sent until the sequence finishes."""

from djl_python.output_formatter import output_formatter
from djl_python.request_io import TextGenerationOutput


@output_formatter
def final_text_only(output: TextGenerationOutput) -> str:
    best = output.sequences[output.best_sequence_index]
    if not best.finished:
        return ""
    return best.text


final_text_only.content_type = "text/plain"
