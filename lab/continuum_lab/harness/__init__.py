"""Starts and drives real SGLang for everything above it (never imported by ``core`` or ``adapter``).

* ``server``     -- ``SGLangServer``: one ``sglang.launch_server`` process, its metrics, its cores.
* ``fleet``      -- several workers behind SGLang's router (smg).
* ``inprocess``  -- SGLang's real ``Scheduler`` built in this process (tests, the emulator).
* ``cpu_cache``  -- a ``ContinuumRadixCache`` on CPU pools, without a scheduler (tests, overhead).
* ``tiny_model`` -- the embedded random Llama and its offline tokenizer.

Besides ``adapter``, this is the only package that reaches into ``sglang.srt`` (to build a
scheduler or a cache in-process); the product itself never imports it.
"""
