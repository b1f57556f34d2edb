#!/usr/bin/env bash
# Serve a model folder with `lightning-grpo serve` on a free loopback port, ask it for one completion over HTTP,
# print the answer and stop the server (docs/guide/export-serve.md). Used by .ci/run.
#
#   bash scripts/serve_once.sh VENV MODEL_DIR PROMPT [MAX_TOKENS] [CHAT]
#
# CHAT=chat asks /v1/chat/completions with PROMPT as the user message (the model's chat template); else
# /v1/completions with PROMPT as raw text. Fails when no healthy server answers within 600 s.
set -euo pipefail
venv=$1 model=$2 prompt=$3 max_tokens=${4:-2} chat=${5:-}
port=$("$venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=$(mktemp)
"$venv/bin/lightning-grpo" serve "$model" --port "$port" > "$log" 2>&1 & server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -f "$log"' EXIT
"$venv/bin/python" - "$port" "$log" "$prompt" "$max_tokens" "$chat" <<'PY'
import json, sys, time, urllib.request
port, log, prompt, max_tokens, chat = sys.argv[1:]
url = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit("serve: no healthy server after 600 s; its log:\n" + open(log).read()[-3000:])
name = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))["data"][0]["id"]
body = {"model": name, "max_tokens": int(max_tokens), "temperature": 0}
if chat:
    path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
else:
    path, body["prompt"] = "/v1/completions", prompt
request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
choice = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]
text = choice["message"]["content"] if chat else choice["text"]
print(f"serve: {url}{path} answered {text!r}")
PY
