"""Vision towers: what turns a picture into the language model's input embeddings.

A vision-language model here is a decoder (:mod:`..decoder`) whose prompt holds placeholder
tokens, one per image embedding; :func:`.registry.vision_model` builds the family's tower and
projector, which the runner calls on each step's new images (:mod:`...runner.image_rows`).
"""
