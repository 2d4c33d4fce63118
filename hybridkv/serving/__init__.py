"""``hybridkv serve``: the engine behind an OpenAI-compatible HTTP server.

- ``engine_loop``: the engine thread (continuous batching for every HTTP
  request), its inbox and per-request result streams;
- ``generation``: one HTTP call's requests, deltas to text, aborts;
- ``detokenize``: incremental text with stop strings;
- ``protocol`` / ``responses``: OpenAI request and response bodies;
- ``errors``: OpenAI's error object for every error; ``token_budget``: ``max_tokens``
  against the context; ``auth``: the API key and what usage reveals;
- ``metrics``: Prometheus metrics (``hybridkv:*``);
- ``app``: the FastAPI routes; ``command``: the CLI.

Needs the ``serve`` extra: ``pip install 'hybridkv[serve]'``.
"""
