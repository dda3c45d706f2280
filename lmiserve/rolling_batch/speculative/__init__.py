"""Speculative decoding: proposers of tokens (:mod:`.ngram`, :mod:`.draft_model`, :mod:`.eagle`),
checked by the model in one run each (:mod:`..runner.verify`)."""
