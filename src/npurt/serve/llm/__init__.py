"""Language models for ``npurt serve --generate``: OpenAI's completions and chat completions API and Triton's
generate extension on the ``--http`` listener, many clients' sequences interleaved step by step on one decoder
runner. Needs the ``serve`` extra (aiohttp); text needs the ``text`` extra (the model folder's tokenizer).

The modules, each importing only those listed before it (and ``npurt.serve.openai``, what every kind served over
OpenAI's API shares: its error object): ``settings`` (the flags), ``params`` (a request's fields, checked),
``textout`` (ids to text as they come, stop strings), ``pools`` (the caches: pooled Generators, or rows of
BatchGenerators whose steps run batched), ``scheduler`` (sequences, the thread that interleaves them), ``model`` (a
served decoder), ``metrics``, ``front`` (a request made a sequence, lengths checked), ``bridge`` (events to the event
loop, gone clients), ``routes`` (the HTTP routes), ``kind`` (the --generate models as one kind the server serves).
"""
