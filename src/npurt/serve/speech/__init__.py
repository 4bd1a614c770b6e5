"""Speech models for ``npurt serve --transcribe NAME=DIR``: OpenAI's ``POST /v1/audio/transcriptions`` (and
``/v1/audio/translations`` for multilingual models) on the ``--http`` listener, over ``npurt.Transcriber``. Needs the
``serve`` extra (aiohttp) and the ``speech`` extra (soundfile, soxr, tokenizers).

The modules, each importing only those listed before it (and ``npurt.serve.openai``: the error object, the kinds):
``settings`` (the flags), ``params`` (a request's form fields, checked), ``formats`` (a transcription as json, text,
srt, vtt or verbose_json), ``routes`` (the model, its admission, the routes), ``kind`` (the --transcribe models as
one kind the server serves).
"""
