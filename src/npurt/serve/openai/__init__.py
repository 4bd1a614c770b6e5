"""What the kinds of model served over OpenAI's API on the ``--http`` listener share (language models, embedding
models, speech models): OpenAI's error object (``errors``), what a kind of served models is to the server
(``kinds``), and the routes over all of them, ``/v1/models`` listing every kind's (``routes``).

The modules, each importing only those listed before it: ``errors``, ``kinds``, ``routes``. Needs the ``serve``
extra (aiohttp).
"""
