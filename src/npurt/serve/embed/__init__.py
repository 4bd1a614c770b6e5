"""Embedding models for ``npurt serve --embed NAME=DIR``: OpenAI's ``POST /v1/embeddings`` on the ``--http``
listener, over ``npurt.Embedder``. Concurrent requests are batched dynamically by a token budget
(``--max-batch-tokens``), as Hugging Face's text-embeddings-inference batches them. Needs the ``serve`` extra
(aiohttp) and the ``text`` extra (the folder's tokenizer).

The modules, each importing only those listed before it (and ``npurt.serve.openai``: the error object, the kinds):
``settings`` (the flags), ``params`` (a request's fields, checked), ``batcher`` (requests' inputs gathered into
runs by tokens), ``routes`` (the model and its route), ``kind`` (the --embed models as one kind the server serves).
"""
