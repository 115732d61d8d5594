"""`python -m sglang.benchmark.serving`: SGLang 0.5.23's online serving benchmark, standard library only.

A subset of the real client's command line (same option strings, types, defaults and choices; anything
else exits 2 through argparse), the same requests to the same paths, the same measurements, the same
stdout summary and the same --output-file record (one JSON object appended per run, the same keys).
The real module needs aiohttp, numpy, requests, tqdm and transformers; this one runs on a simulated host
that has none of them:

- asyncio as the real client, with the standard library's streams instead of aiohttp: every request a task
  of one event loop in one thread, at most --max-concurrency at a time (a semaphore), started at Poisson
  times when --request-rate is finite (numpy's legacy RandomState is reproduced exactly from the seed, so
  --seed gives the real client's lengths and arrival intervals). One thread matters on a busy machine: a
  thread per request hands the GIL over at every chunk, and under CPU contention those hand-overs cost
  more than the requests (a request thread once started 0.9 s late), which a single event loop never pays;
- the tokenizer is whitespace words, which is how the simulated server counts tokens (the real client
  loads the model's HF tokenizer); prompts are filler words, never ShareGPT text (`random` does not
  download ShareGPT here), and no special token is subtracted from the input lengths;
- the random datasets (`random`, `random-ids`) and the local-file ones (`sharegpt`, `custom`, each with
  --dataset-path, read and filtered as the real loaders do; an empty path would download ShareGPT from
  the model hub, which a simulated host cannot: exit 1) and the SGLang/OpenAI-compatible backends are
  implemented; the other choices parse, then exit 1 with a message;
- --goodput ttft:MS tpot:MS e2el:MS adds the real client's goodput keys (sglang/benchmark/goodput.py:
  a request is good when it succeeded and met every limit);
- no progress bar (--disable-tqdm is accepted); each request gives up after SIMSGLANG_BENCH_TIMEOUT
  seconds (default 6 hours, the real client's aiohttp total timeout);
- the simulated GPU's clock: each request carries its send time (header X-Simsglang-Sent, CLOCK_MONOTONIC), the
  simulated server stamps every chunk with the moment its modelled GPU produced it (``sim_time``), and a request
  whose chunks all carry one is timed by them (TTFT, ITL, latency) rather than by when this process read them; a
  closed-loop run (no --request-rate) whose every successful request was so timed lasts the time some request was
  in flight, so that neither the server's nor this client's late wake-ups on a busy machine (the /server_info read
  for the accept length among them) count. On a real GPU host both are microseconds; here, beside a fleet of
  simulated hosts and ansible-playbook on two cores, they reached half a second. Against a server that stamps
  nothing (the real one) every figure is the wall clock's, as the real client's.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import random
import ssl
import sys
import time
import traceback
import urllib.parse
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# -- what the real client defines ------------------------------------------------------------------
BACKENDS = (
    "sglang",
    "sglang-native",
    "sglang-oai",
    "sglang-oai-chat",
    "sglang-embedding",
    "vllm",
    "vllm-chat",
    "vllm-embedding",
    "lmdeploy",
    "lmdeploy-chat",
    "trt",
    "gserver",
    "truss",
)
DATASETS = (
    "agentic-trace",
    "sharegpt",
    "custom",
    "openai",
    "random",
    "random-ids",
    "generated-shared-prefix",
    "mmmu",
    "image",
    "mooncake",
    "longbench_v2",
    "speed-bench",
)
BACKEND_API_PATHS = {
    "sglang": "/generate",
    "sglang-native": "/generate",
    "sglang-oai": "/v1/completions",
    "sglang-oai-chat": "/v1/chat/completions",
    "vllm": "/v1/completions",
    "vllm-chat": "/v1/chat/completions",
    "lmdeploy": "/v1/completions",
    "lmdeploy-chat": "/v1/chat/completions",
}
NATIVE_BACKENDS = ("sglang", "sglang-native")
CHAT_BACKENDS = ("sglang-oai-chat", "vllm-chat", "lmdeploy-chat")
DEFAULT_PORTS = {
    "sglang": 30000,
    "sglang-native": 30000,
    "sglang-oai": 30000,
    "lmdeploy": 23333,
    "vllm": 8000,
    "vllm-embedding": 8000,
    "trt": 8000,
    "gserver": 9988,
    "truss": 8080,
}
DEFAULT_FLUSH_CACHE_TIMEOUT = 60.0
REQUEST_TIMEOUT_SECONDS = 6 * 60 * 60  # the real client's aiohttp ClientTimeout(total=...)
# The record appended to --output-file, in the real client's order (its `result` dict without the
# optional goodput and cache_report entries); --output-details adds DETAIL_KEYS.
RESULT_KEYS = (
    (
        "tag",
        "backend",
        "dataset_name",
        "request_rate",
        "max_concurrency",
        "sharegpt_output_len",
        "random_input_len",
        "random_output_len",
        "random_range_ratio",
        "server_info",
        "duration",
        "completed",
        "total_input_tokens",
        "total_input_text_tokens",
        "total_input_vision_tokens",
        "total_output_tokens",
        "total_output_tokens_retokenized",
        "request_throughput",
        "input_throughput",
        "output_throughput",
        "total_throughput",
    )
    + tuple("%s_%s_ms" % (stat, metric) for metric in ("e2e_latency", "ttft", "tpot", "itl") for stat in ("mean", "median", "std", "p90", "p95", "p99"))
    + ("concurrency", "accept_length", "max_output_tokens_per_s", "max_concurrent_requests")
)
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
# --goodput: the real GoodputMetrics' fields, added to the record in this order.
GOODPUT_SLO_METRICS = ("ttft", "tpot", "e2el")
GOODPUT_KEYS = ("goodput_slos_ms", "request_goodput", "slo_attainment", "slo_attainment_by_metric")
FILLER = ("the", "quick", "benchmark", "prompt", "asks", "for", "plain", "words", "so", "every", "word", "is", "one", "token")


# -- numpy's legacy RandomState, exactly (np.random.seed / randint / exponential) --------------------
class LegacyRandom(object):
    """MT19937 seeded like numpy's RandomState(int); randint and exponential draw the same numbers."""

    def __init__(self, seed):
        state = [int(seed) & 0xFFFFFFFF]
        for index in range(1, 624):
            previous = state[-1]
            state.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
        self.rng = random.Random()
        self.rng.setstate((3, tuple(state) + (624,), None))

    def randint(self, low, high, size):
        """np.random.randint(low, high, size): high exclusive, masked rejection sampling."""
        span = high - 1 - low
        if span == 0:
            return [low] * size
        mask = span
        for shift in (1, 2, 4, 8, 16, 32):
            mask |= mask >> shift
        out = []
        for _dummy in range(size):
            while True:
                value = self.rng.getrandbits(32) & mask
                if value <= span:
                    break
            out.append(low + value)
        return out

    def exponential(self, scale):
        return scale * -math.log(1.0 - self.rng.random())


# -- data ------------------------------------------------------------------------------------------
@dataclass
class DatasetRow:
    prompt: Any
    prompt_len: int
    output_len: int
    text_prompt_len: int = 0
    vision_prompt_len: int = 0
    extra_request_body: dict = field(default_factory=dict)

    def __post_init__(self):
        self.text_prompt_len = self.text_prompt_len or self.prompt_len


@dataclass
class RequestOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list = field(default_factory=list)
    text_chunks: list = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    output_len: int = 0
    start_time: float = 0.0
    spec_accept_length: float = 0.0
    modelled: bool = False  # timed by the simulated server's stamps (module docstring)


def count_tokens(text):
    """The simulated server's tokenizer: one token per whitespace-separated word."""
    return len(str(text).split())


def compute_random_lens(rng, full_len, range_ratio, num):
    if full_len <= 0:
        return [0] * num
    return rng.randint(max(int(full_len * range_ratio), 1), full_len + 1, num)


def sample_random_requests(args, rng):
    input_lens = compute_random_lens(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    output_lens = compute_random_lens(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    return_text = not args.tokenize_prompt
    rows = []
    if args.dataset_name == "random":
        for index in range(args.num_prompts):
            words = [FILLER[(index + j) % len(FILLER)] for j in range(input_lens[index])]
            prompt = " ".join(words) if return_text else list(range(100, 100 + input_lens[index]))
            rows.append(DatasetRow(prompt=prompt, prompt_len=input_lens[index], output_len=output_lens[index]))
    else:
        vocab_size = 32000
        offsets = rng.randint(0, vocab_size, args.num_prompts)
        for index in range(args.num_prompts):
            ids = [int((offsets[index] + index + j) % vocab_size) for j in range(input_lens[index])]
            prompt = " ".join(FILLER[token % len(FILLER)] for token in ids) if return_text else ids
            rows.append(DatasetRow(prompt=prompt, prompt_len=input_lens[index], output_len=output_lens[index]))
    print("#Input tokens: %d" % sum(input_lens))
    print("#Output tokens: %d" % sum(output_lens))
    return rows


def _conversations(data):
    return data.get("conversations", data.get("conversation", [])) if isinstance(data, dict) else []


def _filter_rows(pairs, args):
    """The real loaders' shuffle and filter: --num-prompts rows of at least 2 prompt and output tokens."""
    if args.sharegpt_output_len is not None and args.sharegpt_output_len < 4:
        raise ValueError("output_len too small")
    random.shuffle(pairs)
    rows = []
    for prompt, completion in pairs:
        if len(rows) == args.num_prompts:
            break
        prompt_len = count_tokens(prompt)
        output_len = count_tokens(completion) if args.sharegpt_output_len is None else args.sharegpt_output_len
        if prompt_len < 2 or output_len < 2:
            continue
        if args.sharegpt_context_len and prompt_len + output_len > args.sharegpt_context_len:
            continue
        rows.append(DatasetRow(prompt=prompt, prompt_len=prompt_len, output_len=output_len))
    print("#Input tokens: %d" % sum(row.prompt_len for row in rows))
    print("#Output tokens: %d" % sum(row.output_len for row in rows))
    return rows


def sample_sharegpt_requests(args):
    """sglang/benchmark/datasets/sharegpt.py: a JSON list of {"conversations": [{"value": ...}, ...]}."""
    if not args.dataset_path:
        print("The simulated benchmark client cannot download ShareGPT: give --dataset-path.")
        sys.exit(1)
    with open(args.dataset_path) as handle:
        dataset = json.load(handle)
    dataset = [data for data in dataset if len(_conversations(data)) >= 2]
    pairs = [(_conversations(data)[0]["value"], _conversations(data)[1]["value"]) for data in dataset]
    return _filter_rows(pairs, args)


def sample_custom_requests(args):
    """sglang/benchmark/datasets/custom.py: JSONL, one conversation a line, turns keyed content or value."""
    if not os.path.isfile(args.dataset_path):
        raise FileNotFoundError("Dataset not found at %s" % args.dataset_path)
    dataset = []
    with open(args.dataset_path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line:
                try:
                    dataset.append(json.loads(line))
                except ValueError:
                    continue
    pairs = []
    for data in dataset:
        convs = _conversations(data)
        if len(convs) >= 2:
            pairs.append((convs[0].get("content", convs[0].get("value", "")), convs[1].get("content", convs[1].get("value", ""))))
    return _filter_rows(pairs, args)


# -- goodput (sglang/benchmark/goodput.py) -----------------------------------------------------------
def calculate_goodput(outputs, goodput_slos, dur_s):
    num_good = 0
    num_met = dict.fromkeys(goodput_slos, 0)
    for output in outputs:
        if not output.success:
            continue
        tpot = 0.0
        if output.output_len > 1:
            tpot = (output.latency - output.ttft) / (output.output_len - 1)
        observed_ms = {"ttft": output.ttft * 1000, "tpot": tpot * 1000, "e2el": output.latency * 1000}
        met = [name for name, slo in goodput_slos.items() if observed_ms[name] <= slo]
        for name in met:
            num_met[name] += 1
        if len(met) == len(goodput_slos):
            num_good += 1
    return {  # GOODPUT_KEYS
        "goodput_slos_ms": goodput_slos,
        "request_goodput": num_good / dur_s,
        "slo_attainment": num_good / len(outputs),
        "slo_attainment_by_metric": {name: count / len(outputs) for name, count in num_met.items()},
    }


def print_goodput(goodput):
    slos = " ".join("%s:%s" % (name, f"{slo:g}") for name, slo in goodput["goodput_slos_ms"].items())
    print("{s:{c}^{n}}".format(s="Goodput", n=50, c="-"))
    print("{:<40} {:<10}".format("SLOs (ms):", slos))
    print("{:<40} {:<10.2f}".format("Request goodput (req/s):", goodput["request_goodput"]))
    print("{:<40} {:<10.2f}".format("SLO attainment (%):", goodput["slo_attainment"] * 100))
    for name, attainment in goodput["slo_attainment_by_metric"].items():
        print("{:<40} {:<10.2f}".format("%s SLO attainment (%%):" % name.upper(), attainment * 100))


# -- statistics the way numpy computes them ----------------------------------------------------------
def _mean(values):
    return sum(values) / float(len(values)) if values else float("nan")


def _std(values):
    if not values:
        return float("nan")
    mean = _mean(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / float(len(values)))


def _percentile(values, q):
    """np.percentile (linear interpolation); like numpy, an empty list raises IndexError."""
    if not values:
        raise IndexError("index -1 is out of bounds for axis 0 with size 0")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _or_zero(values):
    return values or [0.0]


# -- HTTP ------------------------------------------------------------------------------------------
def get_auth_headers():
    openai_api_key = os.environ.get("OPENAI_API_KEY")
    if openai_api_key:
        return {"Authorization": "Bearer %s" % openai_api_key}
    api_key = os.environ.get("API_KEY")
    if api_key:
        return {"Authorization": "%s" % api_key}
    return {}


def get_request_headers(args):
    headers = get_auth_headers()
    for item in args.header or []:
        key, _sep, value = item.partition("=")
        if key and value:
            headers[key] = value
    return headers


SENT_HEADER = "X-Simsglang-Sent"


class Clock:
    """One request's moments: the wall clock's (perf_counter), or the simulated server's stamps where its chunks carry
    them (``sim_time``, CLOCK_MONOTONIC, moved onto perf_counter's scale)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.sent = time.monotonic()
        self.stamped = None  # True while every chunk so far had a stamp

    def headers(self, headers):
        return dict(headers, **{SENT_HEADER: "%.6f" % self.sent})

    def moment(self, stamp):
        """When a chunk was produced: its stamp, else now."""
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
            self.stamped = self.stamped is not False
            return stamp - self.sent + self.start
        self.stamped = False
        return time.perf_counter()


def busy_seconds(outputs):
    """How long some request was in flight (the union of [start, start + latency]); None unless every request
    succeeded and was timed by the simulated server's stamps."""
    if not outputs or not all(output.success and output.modelled for output in outputs):
        return None
    total, end = 0.0, None
    for begin, finish in sorted((output.start_time, output.start_time + output.latency) for output in outputs):
        if end is None or begin > end:
            total += finish - begin
            end = finish
        elif finish > end:
            total += finish - end
            end = finish
    return total if total > 0 else None


def request_timeout():
    try:
        return float(os.environ.get("SIMSGLANG_BENCH_TIMEOUT") or REQUEST_TIMEOUT_SECONDS)
    except ValueError:
        return float(REQUEST_TIMEOUT_SECONDS)


class HTTPError(Exception):
    pass


def _open(method, url, body=None, headers=None, timeout=None):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPError("unsupported URL %r" % url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout or request_timeout())
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    data = None
    all_headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        all_headers["Content-Type"] = "application/json"
    connection.request(method, path, body=data, headers=all_headers)
    return connection, connection.getresponse()


def get_json(url, headers=None, timeout=None):
    """(status, parsed JSON or None) of a GET."""
    connection, response = _open("GET", url, headers=headers, timeout=timeout)
    try:
        raw = response.read()
        try:
            return response.status, json.loads(raw.decode("utf-8"))
        except ValueError:
            return response.status, None
    finally:
        connection.close()


def wait_for_endpoint(url, timeout_sec):
    print("Waiting up to %ss for %s to become ready..." % (timeout_sec, url))
    start = time.perf_counter()
    headers = get_auth_headers()
    while True:
        try:
            connection, response = _open("GET", url, headers=headers, timeout=5)
            response.read()
            connection.close()
            if response.status == 200:
                print("Server ready in %.1fs." % (time.perf_counter() - start))
                return True
        except (OSError, http.client.HTTPException, HTTPError):
            pass
        if time.perf_counter() - start >= timeout_sec:
            print("Server did not become ready within %ss timeout." % timeout_sec)
            return False
        time.sleep(1)


class StreamResponse(object):
    """One HTTP/1.1 response read from an asyncio stream: status, reason, headers (lower-case names) and a body read by
    lines (as aiohttp's response.content) or whole; chunked, sized and read-to-close bodies alike."""

    def __init__(self, reader, status, reason, headers, deadline):
        self.reader = reader
        self.status = status
        self.reason = reason
        self.headers = headers
        self.deadline = deadline
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self.left = int(length) if length is not None and not self.chunked else None
        self.buffer = b""
        self.ended = False

    async def _wait(self, awaitable):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request exceeded SIMSGLANG_BENCH_TIMEOUT")
        try:
            return await asyncio.wait_for(awaitable, left)
        except asyncio.TimeoutError:
            raise TimeoutError("request exceeded SIMSGLANG_BENCH_TIMEOUT") from None

    async def _more(self):
        """Append the next piece of the body to the buffer; False at its end."""
        if self.ended:
            return False
        if self.chunked:
            size = int((await self._wait(self.reader.readline())).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.ended = True
                return False
            piece = await self._wait(self.reader.readexactly(size + 2))
            self.buffer += piece[:-2]
            return True
        if self.left is not None:
            if self.left <= 0:
                self.ended = True
                return False
            piece = await self._wait(self.reader.read(min(self.left, 65536)))
            self.left -= len(piece)
        else:
            piece = await self._wait(self.reader.read(65536))
        if not piece:
            self.ended = True
            return False
        self.buffer += piece
        return True

    async def readline(self):
        while b"\n" not in self.buffer:
            if not await self._more():
                line, self.buffer = self.buffer, b""
                return line
        line, _newline, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    async def read(self):
        while await self._more():
            pass
        body, self.buffer = self.buffer, b""
        return body


async def open_stream(method, url, body=None, headers=None):
    """Send one request on a new connection; (writer, StreamResponse) once the status and headers are in."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPError("unsupported URL %r" % url)
    deadline = time.monotonic() + request_timeout()
    secure = ssl.create_default_context() if parts.scheme == "https" else None
    port = parts.port or (443 if secure else 80)
    left = max(deadline - time.monotonic(), 0.001)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port, ssl=secure), left)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    data = b"" if body is None else json.dumps(body).encode("utf-8")
    host = parts.hostname if ":" not in parts.hostname else "[%s]" % parts.hostname
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s:%d" % (host, port), "Accept: */*", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", "Content-Length: %d" % len(data)]
    lines += ["%s: %s" % (name, value) for name, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    try:
        await writer.drain()
        response = StreamResponse(reader, 0, "", {}, deadline)
        status_line = (await response._wait(reader.readline())).decode("latin-1").rstrip("\r\n")
        words = status_line.split(" ", 2)
        if len(words) < 2 or not words[0].startswith("HTTP/"):
            raise http.client.BadStatusLine(status_line)
        received = {}
        while True:
            line = (await response._wait(reader.readline())).decode("latin-1").rstrip("\r\n")
            if not line:
                break
            name, _colon, value = line.partition(":")
            received[name.strip().lower()] = value.strip()
        return writer, StreamResponse(reader, int(words[1]), words[2] if len(words) > 2 else "", received, deadline)
    except BaseException:
        writer.close()
        raise


async def _failure(output, response):
    output.error = (response.reason or "") + ": " + (await response.read()).decode("utf-8", "replace")
    output.success = False


async def request_sglang_generate(args, row, api_url, extra_body, output):
    sampling_params = {"temperature": args.temperature, "max_new_tokens": row.output_len, "ignore_eos": not args.disable_ignore_eos}
    if args.top_p < 1.0:
        sampling_params["top_p"] = args.top_p
    payload = {
        ("text" if isinstance(row.prompt, str) else "input_ids"): row.prompt,
        "sampling_params": sampling_params,
        "stream": not args.disable_stream,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
    }
    payload.update(extra_body)
    generated_text, output_len, ttft, last_output_len = "", row.output_len, 0.0, 0
    clock = Clock()
    st = clock.start
    output.start_time = most_recent = st
    connection, response = await open_stream("POST", api_url, payload, clock.headers(get_request_headers(args)))
    try:
        if response.status != 200:
            await _failure(output, response)
            return
        latency = 0.0
        while True:
            raw = await response.readline()
            if not raw:
                break
            chunk = raw.strip()
            if not chunk:
                continue
            data_bytes = chunk[6:] if chunk.startswith(b"data: ") else chunk
            if data_bytes == b"[DONE]":
                if not clock.stamped:
                    latency = time.perf_counter() - st
                continue
            data = json.loads(data_bytes)
            meta = data.get("meta_info") or {}
            timestamp = clock.moment(meta.get("sim_time"))
            latency = timestamp - st
            if meta.get("spec_accept_length") is not None:
                output.spec_accept_length = meta["spec_accept_length"]
            _record_server_prompt_len(data, output)
            if data.get("text"):
                generated_text = data["text"]
                output_len = data["meta_info"]["completion_tokens"]
                if ttft == 0.0:
                    ttft = timestamp - st
                    output.ttft = ttft
                else:
                    new_tokens = output_len - last_output_len
                    if new_tokens == 0:
                        continue
                    output.itl.extend([(timestamp - most_recent) / new_tokens] * new_tokens)
                most_recent = timestamp
                last_output_len = output_len
        output.generated_text = generated_text
        output.success = True
        output.latency = latency
        output.output_len = output_len
        output.modelled = bool(clock.stamped)
    finally:
        connection.close()


def _record_server_prompt_len(data, output):
    reported = data.get("usage") or data.get("meta_info") or {}
    if reported.get("prompt_tokens"):
        output.prompt_len = reported["prompt_tokens"]


def _combine_chat_content(message):
    return (message.get("reasoning_content") or message.get("reasoning") or "") + (message.get("content") or "")


async def request_openai(args, row, api_url, extra_body, output, model, chat):
    if chat:
        messages = row.prompt if isinstance(row.prompt, list) and row.prompt and isinstance(row.prompt[0], dict) else [{"role": "user", "content": row.prompt}]
        payload = {"model": model, "messages": messages, "max_completion_tokens": row.output_len, "stream": not args.disable_stream}
    else:
        payload = {"model": model, "prompt": row.prompt, "best_of": 1, "max_tokens": row.output_len, "stream": not args.disable_stream}
    if "temperature" not in extra_body:
        payload["temperature"] = 0.0
    if "ignore_eos" not in extra_body:
        payload["ignore_eos"] = not args.disable_ignore_eos
    payload.update(extra_body)
    generated_text, output_len, ttft = "", row.output_len, 0.0
    clock = Clock()
    st = clock.start
    output.start_time = most_recent = st
    connection, response = await open_stream("POST", api_url, payload, clock.headers(get_request_headers(args)))
    try:
        if response.status != 200:
            await _failure(output, response)
            return
        if chat and args.disable_stream:
            body = json.loads((await response.read()).decode("utf-8"))
            output.generated_text = _combine_chat_content(body["choices"][0]["message"])
            output.success = True
            output.latency = time.perf_counter() - st
            output.ttft = output.latency
            output.output_len = body.get("usage", {}).get("completion_tokens", output_len)
            _record_server_prompt_len(body, output)
            output.spec_accept_length = (body["choices"][0].get("meta_info") or {}).get("spec_accept_length", 0.0) or 0.0
            return
        latency = 0.0
        while True:
            raw = await response.readline()
            if not raw:
                break
            chunk = raw.strip()
            if not chunk:
                continue
            text = chunk.decode("utf-8")
            text = text[len("data: ") :] if text.startswith("data: ") else text
            if text == "[DONE]":
                if not clock.stamped:
                    latency = time.perf_counter() - st
                continue
            data = json.loads(text)
            timestamp = clock.moment(data.get("sim_time"))
            latency = timestamp - st
            if chat:
                output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
                _record_server_prompt_len(data, output)
                choices = data.get("choices") or []
                if not choices:
                    continue
                content = _combine_chat_content(choices[0].get("delta") or {})
            else:
                _record_server_prompt_len(data, output)
                content = data["choices"][0]["text"]
            if content:
                if ttft == 0.0:
                    ttft = timestamp - st
                    output.ttft = ttft
                else:
                    output.text_chunks.append(content)
                    output.itl.append(timestamp - most_recent)
                most_recent = timestamp
                generated_text += content
                if not chat:
                    output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
        output.generated_text = generated_text
        output.success = True
        output.latency = latency
        output.output_len = output_len
        output.modelled = bool(clock.stamped)
    finally:
        connection.close()


async def run_one(args, backend, row, api_url, extra_body, model):
    output = RequestOutput(prompt_len=row.prompt_len)
    try:
        if backend in NATIVE_BACKENDS:
            await request_sglang_generate(args, row, api_url, extra_body, output)
        else:
            await request_openai(args, row, api_url, extra_body, output, model, backend in CHAT_BACKENDS)
    except Exception:  # noqa: BLE001  (the real client records every failure as the request's error)
        output.success = False
        output.error = "".join(traceback.format_exception(*sys.exc_info()))
        if backend in NATIVE_BACKENDS:
            print("output.error=%r" % output.error)
    return output


async def _run_all(args, backend, rows, api_url, extra_body, model, max_concurrency, request_rate, rng):
    outputs = [None] * len(rows)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def worker(index, row):
        if gate is None:
            outputs[index] = await run_one(args, backend, row, api_url, extra_body, model)
            return
        async with gate:
            outputs[index] = await run_one(args, backend, row, api_url, extra_body, model)

    tasks = []
    for index, row in enumerate(rows):
        tasks.append(asyncio.ensure_future(worker(index, row)))
        if request_rate != float("inf") and rng is not None:
            await asyncio.sleep(rng.exponential(1.0 / request_rate))
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=request_timeout() * (len(rows) if max_concurrency else 1) + 60)
        for task in pending:
            task.cancel()
    for index, output in enumerate(outputs):
        if output is None:
            outputs[index] = RequestOutput(prompt_len=rows[index].prompt_len, error="request did not finish before the benchmark's deadline")
    return outputs


def run_all(args, backend, rows, api_url, extra_body, model, max_concurrency, request_rate, rng):
    """Send every row (bounded: at most max_concurrency at once), each a task of one event loop; outputs in row order."""
    return asyncio.run(_run_all(args, backend, rows, api_url, extra_body, model, max_concurrency, request_rate, rng))


# -- metrics ---------------------------------------------------------------------------------------
def calculate_metrics(rows, outputs, dur_s, backend, accept_length):
    output_lens, retokenized, itls, tpots, ttfts, e2e, retokenized_itls = [], [], [], [], [], [], []
    total_input = total_input_text = total_input_vision = completed = 0
    use_retokenized_itl = accept_length is not None and accept_length > 0 and backend in ("sglang-oai", "sglang-oai-chat")
    for index, output in enumerate(outputs):
        if output.success:
            output_lens.append(output.output_len)
            retokenized.append(count_tokens(output.generated_text))
            total_input += rows[index].prompt_len
            total_input_text += rows[index].text_prompt_len
            total_input_vision += rows[index].vision_prompt_len
            if output.output_len > 1:
                tpots.append((output.latency - output.ttft) / (output.output_len - 1))
            if use_retokenized_itl:
                for k, itl in enumerate(output.itl):
                    tokens = count_tokens(output.text_chunks[k])
                    if tokens:
                        retokenized_itls.extend([itl / tokens] * tokens)
            else:
                itls += output.itl
            ttfts.append(output.ttft)
            e2e.append(output.latency)
            completed += 1
        else:
            output_lens.append(0)
            retokenized.append(0)
    if completed == 0:
        warnings.warn("All requests failed. This is likely due to a misconfiguration on the benchmark arguments.", stacklevel=2)
    max_output_tokens_per_s, max_concurrent_requests = 0.0, 0
    successful = [output for output in outputs if output.success]
    if successful:
        min_start = min(output.start_time for output in successful)
        max_end = max(output.start_time + output.latency for output in successful)
        seconds = int(math.ceil(max_end - min_start)) + 1
        tokens_per_second = [0.0] * seconds
        concurrent = [0.0] * seconds
        for output in successful:
            token_time = output.start_time + output.ttft
            times = [token_time]
            for itl in output.itl:
                token_time += itl
                times.append(token_time)
            for moment in times:
                bucket = int(moment - min_start)
                if 0 <= bucket < seconds:
                    tokens_per_second[bucket] += 1
            first, last = int(output.start_time - min_start), int(output.start_time + output.latency - min_start)
            for second in range(first, min(last + 1, seconds)):
                concurrent[second] += 1
        max_output_tokens_per_s = float(max(tokens_per_second))
        max_concurrent_requests = int(max(concurrent))
    itls = retokenized_itls if use_retokenized_itl else itls
    total_output = sum(output_lens)
    metrics = {
        "completed": completed,
        "total_input": total_input,
        "total_input_text": total_input_text,
        "total_input_vision": total_input_vision,
        "total_output": total_output,
        "total_output_retokenized": sum(retokenized),
        "request_throughput": completed / dur_s,
        "input_throughput": total_input / dur_s,
        "output_throughput": total_output / dur_s,
        "total_throughput": (total_input + total_output) / dur_s,
    }
    for name, values in (("ttft", _or_zero(ttfts)), ("tpot", _or_zero(tpots)), ("itl", _or_zero(itls))):
        metrics.update(
            {
                "mean_%s_ms" % name: _mean(values) * 1000,
                "median_%s_ms" % name: _percentile(values, 50) * 1000,
                "std_%s_ms" % name: _std(values) * 1000,
                "p90_%s_ms" % name: _percentile(values, 90) * 1000,
                "p95_%s_ms" % name: _percentile(values, 95) * 1000,
                "p99_%s_ms" % name: _percentile(values, 99) * 1000,
            }
        )
    metrics["max_itl_ms"] = max(_or_zero(itls)) * 1000
    metrics.update(
        {
            "mean_e2e_latency_ms": _mean(e2e) * 1000,
            "median_e2e_latency_ms": (_percentile(e2e, 50) if e2e else float("nan")) * 1000,
            "std_e2e_latency_ms": _std(e2e) * 1000,
            "p90_e2e_latency_ms": _percentile(e2e, 90) * 1000,  # IndexError when nothing succeeded, as numpy's
            "p95_e2e_latency_ms": _percentile(e2e, 95) * 1000,
            "p99_e2e_latency_ms": _percentile(e2e, 99) * 1000,
            "concurrency": sum(e2e) / dur_s,
            "max_output_tokens_per_s": max_output_tokens_per_s,
            "max_concurrent_requests": max_concurrent_requests,
        }
    )
    return metrics, output_lens


def _line(label, value, fmt=""):
    print(("{:<40} {:<10%s}" % fmt).format(label, value))


def print_summary(backend, request_rate, max_concurrency, metrics, duration, accept_length):
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    _line("Backend:", backend)
    _line("Traffic request rate:", request_rate)
    _line("Max request concurrency:", max_concurrency if max_concurrency else "not set")
    _line("Successful requests:", metrics["completed"])
    _line("Benchmark duration (s):", duration, ".2f")
    _line("Total input tokens:", metrics["total_input"])
    _line("Total input text tokens:", metrics["total_input_text"])
    _line("Total generated tokens:", metrics["total_output"])
    _line("Total generated tokens (retokenized):", metrics["total_output_retokenized"])
    _line("Request throughput (req/s):", metrics["request_throughput"], ".2f")
    _line("Input token throughput (tok/s):", metrics["input_throughput"], ".2f")
    _line("Output token throughput (tok/s):", metrics["output_throughput"], ".2f")
    _line("Peak output token throughput (tok/s):", metrics["max_output_tokens_per_s"], ".2f")
    _line("Peak concurrent requests:", metrics["max_concurrent_requests"])
    _line("Total token throughput (tok/s):", metrics["total_throughput"], ".2f")
    _line("Concurrency:", metrics["concurrency"], ".2f")
    if accept_length:
        _line("Accept length:", accept_length, ".2f")
    print("{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"))
    for label, key in (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99")):
        _line("%s E2E Latency (ms):" % label, metrics["%s_e2e_latency_ms" % key], ".2f")
    print("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    for label, key in (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99")):
        _line("%s TTFT (ms):" % label, metrics["%s_ttft_ms" % key], ".2f")
    print("{s:{c}^{n}}".format(s="Time per Output Token (excl. 1st token)", n=50, c="-"))
    for label, key in (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99")):
        _line("%s TPOT (ms):" % label, metrics["%s_tpot_ms" % key], ".2f")
    print("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    for label, key in (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P95", "p95"), ("P99", "p99")):
        _line("%s ITL (ms):" % label, metrics["%s_itl_ms" % key], ".2f")
    _line("Max ITL (ms):", metrics["max_itl_ms"], ".2f")
    print("=" * 50)


def fetch_accept_length(base_url, backend):
    """Like the real client: internal_states[0].avg_spec_accept_length from /server_info (sglang backends)."""
    if "sglang" not in backend:
        return None
    try:
        status, info = get_json(base_url + "/server_info", get_auth_headers(), timeout=30)
    except (OSError, http.client.HTTPException, HTTPError):
        return None
    if status != 200 or not isinstance(info, dict):
        return None
    if "decode" in info:
        info = info["decode"][0]
    states = info.get("internal_states")
    return states[0].get("avg_spec_accept_length", None) if states else None


def benchmark(args, backend, api_url, base_url, model_id, rows, rng, extra_body):
    max_concurrency = args.max_concurrency
    print("Starting warmup with %d sequences..." % args.warmup_requests)
    first = rows[0]
    warm_row = DatasetRow(prompt=first.prompt, prompt_len=first.prompt_len, output_len=min(first.output_len, 32))
    warm = run_all(args, backend, [warm_row] * args.warmup_requests, api_url, extra_body, model_id, max_concurrency, float("inf"), None)
    if args.warmup_requests > 0 and not any(output.success for output in warm):
        raise ValueError("Warmup failed - Please make sure benchmark arguments are correctly specified. Error: %s" % warm[0].error)
    print("Warmup completed with %d sequences. Starting main benchmark run..." % args.warmup_requests)
    if args.flush_cache or ("sglang" in backend and os.environ.get("SGLANG_IS_IN_CI", "false").lower() in ("true", "1")):
        flush_server_cache(base_url, args.flush_cache_timeout)
    time.sleep(1.0)

    start = time.perf_counter()
    outputs = run_all(args, backend, rows, api_url, extra_body, model_id, max_concurrency, args.request_rate, rng)
    accept_length = fetch_accept_length(base_url, backend)
    duration = time.perf_counter() - start
    if args.request_rate == float("inf"):
        duration = busy_seconds(outputs) or duration
    metrics, output_lens = calculate_metrics(rows, outputs, duration, backend, accept_length)
    goodput = calculate_goodput(outputs, dict(args.goodput), duration) if args.goodput else None
    print_summary(backend, args.request_rate, max_concurrency, metrics, duration, accept_length)
    if goodput:
        print_goodput(goodput)

    try:
        status, server_info = get_json(base_url + "/server_info", get_auth_headers(), timeout=30)
        server_info = server_info if status == 200 else None
    except (OSError, http.client.HTTPException, HTTPError):
        server_info = None
    values = dict(metrics)
    values.update(
        {
            "tag": args.tag,
            "backend": args.backend,
            "dataset_name": args.dataset_name,
            "request_rate": args.request_rate,
            "max_concurrency": max_concurrency,
            "sharegpt_output_len": args.sharegpt_output_len,
            "random_input_len": args.random_input_len,
            "random_output_len": args.random_output_len,
            "random_range_ratio": args.random_range_ratio,
            "server_info": server_info,
            "duration": duration,
            "total_input_tokens": metrics["total_input"],
            "total_input_text_tokens": metrics["total_input_text"],
            "total_input_vision_tokens": metrics["total_input_vision"],
            "total_output_tokens": metrics["total_output"],
            "total_output_tokens_retokenized": metrics["total_output_retokenized"],
            "accept_length": accept_length,
        }
    )
    result = {key: values[key] for key in RESULT_KEYS}
    if goodput:
        result.update(goodput)
    if args.output_file:
        file_name = args.output_file
    else:
        now = datetime.now().strftime("%m%d")
        file_name = "%s_%s_%d_%d_%d.jsonl" % (args.backend, now, args.num_prompts, args.random_input_len, args.random_output_len)
    details = {  # DETAIL_KEYS
        "input_lens": [output.prompt_len for output in outputs],
        "output_lens": output_lens,
        "ttfts": [output.ttft for output in outputs],
        "itls": [output.itl for output in outputs],
        "generated_texts": [output.generated_text for output in outputs],
        "errors": [output.error for output in outputs],
    }
    with open(file_name, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(dict(result, **details) if args.output_details else result) + "\n")
    return dict(result, **details)


def flush_server_cache(base_url, timeout):
    deadline = time.monotonic() + timeout
    while True:
        connection, response = _open("POST", base_url + "/flush_cache", headers=get_auth_headers(), timeout=30)
        response.read()
        connection.close()
        if response.status == 200:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError("Failed to flush the SGLang cache within %ss (last status %d)" % (timeout, response.status))
        time.sleep(1.0)


def run_benchmark(args):
    print("benchmark_args=%s" % (args,))
    rng = LegacyRandom(args.seed)
    random.seed(args.seed)
    extra_body = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.tokenize_prompt and args.backend != "sglang":
        raise AssertionError("`--tokenize-prompt` only compatible with `--backend sglang` currently")
    if args.port is None:
        args.port = DEFAULT_PORTS.get(args.backend, 30000)
    if args.base_url:
        base_url = args.base_url
    else:
        host = "[%s]" % args.host if ":" in args.host and not args.host.startswith("[") else args.host
        base_url = "http://%s:%d" % (host, args.port)
    model_url = base_url + "/v1/models"
    if args.backend not in BACKEND_API_PATHS:
        print("The %s backend is not available in the simulated benchmark client." % args.backend)
        sys.exit(1)
    api_url = base_url + BACKEND_API_PATHS[args.backend]
    if args.ready_check_timeout_sec > 0 and not wait_for_endpoint(model_url, args.ready_check_timeout_sec):
        print("Server at %s is not ready. Exiting." % model_url)
        sys.exit(1)
    if args.model is None:
        try:
            _status, body = get_json(model_url, get_auth_headers(), timeout=30)
            models = (body or {}).get("data", [])
            args.model = models[0]["id"] if models else None
        except Exception as exc:  # noqa: BLE001
            print("Failed to fetch model from %s. Error: %s" % (model_url, exc))
            print("Please specify the correct host and port using `--host` and `--port`.")
            sys.exit(1)
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        sys.exit(1)
    print("%s\n" % (args,))
    if args.dataset_name == "sharegpt":
        rows = sample_sharegpt_requests(args)
    elif args.dataset_name == "custom":
        rows = sample_custom_requests(args)
    elif args.dataset_name in ("random", "random-ids"):
        rows = sample_random_requests(args, rng)
    else:
        print("The %s dataset is not available in the simulated benchmark client (random, random-ids, sharegpt and custom are)." % args.dataset_name)
        sys.exit(1)
    return benchmark(args, args.backend, api_url, base_url, args.served_model_name or args.model, rows, rng, extra_body)


def _finite_positive_float(value):
    try:
        parsed = float(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError("expected a finite float > 0, got %r" % (value,)) from exc
    if not math.isfinite(parsed) or parsed <= 0:
        raise argparse.ArgumentTypeError("expected a finite float > 0, got %r" % (value,))
    return parsed


def _goodput_slo(pair):
    """argparse type for one --goodput KEY:VALUE entry; VALUE is in milliseconds."""
    name, _sep, value = pair.partition(":")
    if name not in GOODPUT_SLO_METRICS:
        raise argparse.ArgumentTypeError("expected KEY:VALUE with KEY in %s, got %r" % (", ".join(GOODPUT_SLO_METRICS), pair))
    return name, _finite_positive_float(value)


def build_parser():
    """The subset of SGLang 0.5.23's parser this client implements: same strings, types, defaults, choices."""
    parser = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    add = parser.add_argument
    add("--backend", type=str, choices=list(BACKENDS), default="sglang", help="Must specify a backend, depending on the LLM Inference Engine.")
    add("--base-url", type=str, default=None, help="Server or API base url if not using http host and port.")
    add("--host", type=str, default="0.0.0.0", help="Default host is 0.0.0.0.")
    add("--port", type=int, help="If not set, the default port is configured according to its default value for different LLM Inference Engines.")
    add("--ready-check-timeout-sec", type=int, default=60, help="Maximum time in seconds to wait for the server to be ready. Set to 0 to skip.")
    add("--dataset-name", type=str, default="sharegpt", choices=list(DATASETS), help="Name of the dataset to benchmark on.")
    add("--dataset-path", type=str, default="", help="Path to the dataset.")
    add("--model", type=str, help="Name or path of the model. If not set, the default model will request /v1/models for conf.")
    add("--served-model-name", type=str, help="The name of the model as served by the serving service.")
    add("--tokenizer", type=str, help="Name or path of the tokenizer. If not set, using the model conf.")
    add("--num-prompts", type=int, default=1000, help="Number of prompts to process. Default is 1000.")
    add("--sharegpt-output-len", type=int, default=None, help="Output length for each request (ShareGPT dataset).")
    add("--sharegpt-context-len", type=int, default=None, help="Requests longer than this context length are dropped (ShareGPT dataset).")
    add("--random-input-len", type=int, default=1024, help="Number of input tokens per request, used only for random and image dataset.")
    add("--random-output-len", default=1024, type=int, help="Number of output tokens per request, used only for random and image dataset.")
    add("--random-range-ratio", type=float, default=0.0, help="Range of sampled ratio of input/output length, used only for random and image dataset.")
    add("--request-rate", type=float, default=float("inf"), help="Number of requests per second. inf sends them all at time 0 (Poisson otherwise).")
    add("--max-concurrency", type=int, default=None, help="Maximum number of concurrent requests.")
    add("--output-file", type=str, help="Output JSONL file name.")
    add("--output-details", action="store_true", help="Output details of benchmarking.")
    add("--goodput", nargs="+", type=_goodput_slo, default=None, metavar="KEY:VALUE", help="SLOs for goodput as KEY:VALUE pairs in milliseconds.")
    add("--disable-tqdm", action="store_true", help="Specify to disable tqdm progress bar.")
    add("--disable-stream", action="store_true", help="Disable streaming mode.")
    add("--seed", type=int, default=42, help="The random seed.")
    add("--disable-ignore-eos", action="store_true", help="Disable ignoring EOS.")
    add("--temperature", type=float, default=0.0, help="Sampling temperature.")
    add("--top-p", type=float, default=1.0, help="Nucleus sampling parameter.")
    add("--extra-request-body", metavar='{"key1": "value1", "key2": "value2"}', type=str, help="Append given JSON object to the request payload.")
    add("--apply-chat-template", action="store_true", help="Apply chat template")
    add("--flush-cache", action="store_true", help="Flush the cache before running the benchmark")
    add("--flush-cache-timeout", type=_finite_positive_float, default=DEFAULT_FLUSH_CACHE_TIMEOUT, help="Maximum seconds to wait before flushing the cache")
    add("--warmup-requests", type=int, default=1, help="Number of warmup requests to run before the benchmark")
    add("--tokenize-prompt", action="store_true", help="Use integer ids instead of string for inputs.")
    add("--tag", type=str, default=None, help="The tag to be dumped to output.")
    add("--header", type=str, nargs="+", default=None, help="Custom HTTP headers in Key=Value format.")
    return parser


def cli_main(argv=None):
    args = build_parser().parse_args(argv)
    run_benchmark(args)


if __name__ == "__main__":
    cli_main()
