"""Building the shipped models (not decoding): the corpus, the tokenizer, the dual-mode objective and the
any-order objective; ``python -m packed_ss.train`` is the command line (:mod:`packed_ss.training.train`)."""
