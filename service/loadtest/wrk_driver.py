"""The ``wrk`` driver: a Lua script generated per phase, its summary read back as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from service.errors import ServiceError
from service.loadtest.report import PhaseResult
from service.loadtest.workload import Workload

_MARKER = "LOADTEST_JSON "

_SCRIPT = r"""
local kind = __KIND__
local fixed_path = __PATH__
local seeds = __SEEDS__
local seeds_json = __SEEDS_JSON__
local replay = __REPLAY__
local replay_fraction = __REPLAY_FRACTION__
local query_fresh = __QUERY_FRESH__
local query_replay = __QUERY_REPLAY__
local batch_size = __BATCH_SIZE__
local batch_head = __BATCH_HEAD__
local headers = __HEADERS__

local threads = {}
local next_id = 1

function setup(thread)
  thread:set("thread_id", next_id)
  table.insert(threads, thread)
  next_id = next_id + 1
end

function init(args)
  math.randomseed(os.time() * 1000 + thread_id)
  statuses = {}
  codes = {}
  item_errors = 0
end

function request()
  if kind == "path" then
    return wrk.format("GET", fixed_path, headers)
  end
  if kind == "batch" then
    local parts = {}
    for i = 1, batch_size do parts[i] = seeds_json[math.random(#seeds_json)] end
    return wrk.format("POST", "/v1/ppr/batch", headers,
                      batch_head .. table.concat(parts, ",") .. "]}")
  end
  if #replay > 0 and math.random() < replay_fraction then
    return wrk.format("GET", "/v1/ppr/" .. replay[math.random(#replay)] .. query_replay, headers)
  end
  return wrk.format("GET", "/v1/ppr/" .. seeds[math.random(#seeds)] .. query_fresh, headers)
end

function response(status, hdrs, body)
  local key = tostring(status)
  statuses[key] = (statuses[key] or 0) + 1
  if status >= 400 then
    local code = string.match(body or "", '"code"%s*:%s*"([%w_%-%.]+)"') or "-"
    local both = key .. " " .. code
    codes[both] = (codes[both] or 0) + 1
  end
  if kind == "batch" and status == 200 then
    for _ in string.gmatch(body, '"error":') do item_errors = item_errors + 1 end
  end
end

function done(summary, latency, requests)
  local all = {}
  local all_codes = {}
  local item_errs = 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses")) do all[k] = (all[k] or 0) + v end
    for k, v in pairs(t:get("codes")) do all_codes[k] = (all_codes[k] or 0) + v end
    item_errs = item_errs + t:get("item_errors")
  end
  local parts = {}
  for k, v in pairs(all) do table.insert(parts, string.format('"%s":%d', k, v)) end
  local code_parts = {}
  for k, v in pairs(all_codes) do table.insert(code_parts, string.format('"%s":%d', k, v)) end
  local e = summary.errors
  io.write(string.format(
    '__MARKER__{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50":%d,"p90":%d,"p99":%d,"statuses":{%s},"codes":{%s},' ..
    '"item_errors":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    table.concat(parts, ","), table.concat(code_parts, ","), item_errs))
end
"""


def lua_string(text: str) -> str:
    """A Lua string literal for any text (decimal escapes for all but safe ASCII)."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        if 32 <= byte < 127 and char not in '"\\':
            out.append(char)
        else:
            out.append(f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def _lua_list(items: list[str]) -> str:
    return "{" + ",".join(lua_string(item) for item in items) + "}"


def script_for(workload: Workload) -> str:
    from urllib.parse import quote

    head = json.dumps({k: v for k, v in workload.batch_body([]).items() if k != "nodes"})
    values = {
        "__KIND__": lua_string(workload.kind),
        "__PATH__": lua_string(workload.path),
        "__SEEDS__": _lua_list([quote(s, safe="") for s in workload.seeds]),
        "__SEEDS_JSON__": _lua_list(
            [json.dumps(s) for s in workload.seeds] if workload.kind == "batch" else []
        ),
        "__REPLAY__": _lua_list([quote(s, safe="") for s in workload.replay_seeds]),
        "__REPLAY_FRACTION__": repr(float(workload.replay_fraction)),
        "__QUERY_FRESH__": lua_string(workload.query_string(fresh=True)),
        "__QUERY_REPLAY__": lua_string(workload.query_string(fresh=False)),
        "__BATCH_SIZE__": str(int(workload.batch_size)),
        "__BATCH_HEAD__": lua_string(head[:-1] + ', "nodes": ['),
        "__HEADERS__": "{"
        + ",".join(
            f"[{lua_string(k)}]={lua_string(v)}"
            for k, v in {**workload.headers, "Content-Type": "application/json"}.items()
        )
        + "}",
        "__MARKER__": _MARKER,
    }
    script = _SCRIPT
    for name, value in values.items():
        script = script.replace(name, value)
    return script


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    base_url: str, workload: Workload, *, concurrency: int, seconds: float, timeout_s: float = 30
) -> PhaseResult:
    binary = shutil.which("wrk")
    if binary is None:
        raise ServiceError("wrk is not installed (apt-get install -y wrk); use --driver httpx")
    with tempfile.TemporaryDirectory(prefix="ppr-wrk-") as tmp:
        path = Path(tmp) / f"{workload.name}.lua"
        path.write_text(script_for(workload))
        command = [
            binary, f"-t{min(2, concurrency)}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
            f"--timeout={max(1, round(timeout_s))}s", "-s", str(path), base_url,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.startswith(_MARKER):
            data = json.loads(line[len(_MARKER) :])
            break
    else:
        raise ServiceError(f"wrk failed (exit {done.returncode}): {done.stderr.strip()}")
    socket_errors = data["connect"] + data["read"] + data["write"] + data["timeout"]
    return PhaseResult(
        phase=workload.name,
        driver="wrk",
        concurrency=concurrency,
        seconds=data["duration_us"] / 1e6,
        requests=int(data["requests"]),
        errors=int(data["status"]) + socket_errors,
        p50_ms=data["p50"] / 1000.0,
        p90_ms=data["p90"] / 1000.0,
        p99_ms=data["p99"] / 1000.0,
        items_per_request=workload.items_per_request,
        item_errors=int(data["item_errors"]),
        statuses={str(k): int(v) for k, v in data["statuses"].items()},
        error_codes={str(k): int(v) for k, v in data.get("codes", {}).items()},
        socket_errors=socket_errors,
    )
