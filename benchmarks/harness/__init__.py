"""What the benchmarks share: where the repository, caches and results are (``paths``), the
machine header and the load of other processes (``machine``), statistics over rounds
(``stats``), the fixed-width table (``table``), the generated corpora (``text_corpus``,
``token_corpus``), the tokenizer limits and baselines (``tokenize_contestants``), the model
and ``Trainer`` setup of the training-step benchmarks (``train_setup``) and the count of the
collectives a process calls (``collectives``).
"""
