"""After ``Engine.warmup`` a request neither compiles nor loads a numba kernel: the prompt index's
kernels (built by every request's lookup session) are warm before the first request. Checked in a
fresh interpreter, where every numba dispatcher starts empty; whether numba compiles or loads from
its disk cache, a kernel first used by the request shows up as a new overload."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, sys
    from numba.core.registry import CPUDispatcher
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from lookupspec.params import GenerationParams

    def overloads():
        found = {}
        for name, mod in list(sys.modules.items()):
            if name.startswith("lookupspec"):
                for attr, obj in list(vars(mod).items()):
                    if isinstance(obj, CPUDispatcher):
                        found[name + "." + attr] = len(obj.overloads)
        return found

    engine = Engine(load_model(sys.argv[1]).model)
    engine.warmup(sizes=(1, 4), batches=(1, 2), context=16)
    before = overloads()
    prompt = [5, 6, 7, 8, 9] * 6 + [5, 6, 7]  # repeats: the lookup finds matches and drafts trees
    steps = list(engine.generate(prompt, GenerationParams(max_tokens=12)))
    after = overloads()
    print(json.dumps({"new": {k: [before.get(k, 0), n] for k, n in after.items() if n != before.get(k, 0)},
                      "draft_tokens": steps[-1].stats.draft_tokens,
                      "dispatchers": len(after)}))
""")


@pytest.mark.slow
def test_a_request_after_warmup_compiles_no_numba_kernel(tiny_models):
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tiny_models["tiny-llama"])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dispatchers"] > 5  # the index and drafting modules were imported and seen
    assert report["draft_tokens"] > 0  # the request looked up and verified drafts
    assert report["new"] == {}, report["new"]
