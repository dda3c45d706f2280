"""One jsonlines line per token, with fields of our own (named by option.output_formatter)."""

import json

from djl_python.request_io import TextGenerationOutput


def token_lines(output: TextGenerationOutput) -> str:
    best = output.sequences[output.best_sequence_index]
    lines = []
    while best.has_next_token():
        token, first, last = best.get_next_token()
        line = {"token": token.as_dict(), "request_id": output.request_id, "first": first, "source": "custom"}
        if last:
            line["generated_text"] = best.text
            line["finish_reason"] = best.finish_reason
            line["prompt_tokens"] = len(output.input.input_ids)
            line["max_new_tokens"] = output.input.parameters.get("max_new_tokens")
        lines.append(json.dumps(line) + "\n")
    return "".join(lines)
