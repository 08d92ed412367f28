#!/usr/bin/env bash
# test_gpcd_dashboard.sh: gpcd's web page in headless Chromium. gpcd runs
# with simulated GPUs and a TCP listener with a token; the test submits a
# job (its name has HTML in it), heats one GPU past the alert threshold
# through simulated_file, then loads http://127.0.0.1:PORT/#token=TOKEN with
# --dump-dom (virtual time lets the page's script fetch the API) and checks
# that the page shows every GPU with its reading, the running job (its name
# as text, not markup), and the alert; without the token the page asks for
# it. The page itself needs no token, the API does. A screenshot is kept as
# TMPDIR/gpcd-dashboard.*/dashboard.png (path printed). Skips (77) without
# gpcd or chromium.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || { echo "skip: gpcd is not built"; exit 77; }
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[[ -n $CHROMIUM ]] || { echo "skip: chromium is not installed (apt-get install chromium)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpcd-dashboard.XXXXXX")
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
cleanup() {
  gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"
  # keep only the screenshot
  find "$work" -mindepth 1 -maxdepth 1 ! -name dashboard.png -exec rm -rf {} +
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/gpcd.log" ]] && tail -5 "$work/gpcd.log" >&2; exit 1; }
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"
name_failures

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=tok$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$token" >"$work/token"
chmod 600 "$work/token" # gpcd refuses a token others can read
cat >"$work/gpcd.conf" <<CONF
state_dir = $work/state
gpus = simulated:4x80GB
sample_interval = 0.2s
listen = 127.0.0.1:$port
token_file = $work/token
simulated_file = $work/sim
CONF
"$GPCD" --config "$work/gpcd.conf" --foreground >"$work/gpcd.log" 2>&1 &
gpcd_pid=$!
url=http://127.0.0.1:$port
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 'curl -sf --max-time 10 -o /dev/null "$url/"' || fail "gpcd does not answer at $url"

# the page: HTML, no token needed, locked down; the API still wants the token
curl -s --max-time 10 -D "$work/headers" -o "$work/page.html" "$url/" || fail "GET / failed"
grep -qi '^content-type: text/html; charset=utf-8' "$work/headers" || fail "page type: $(cat "$work/headers")"
grep -qi "^content-security-policy: default-src 'none'.*connect-src 'self'" "$work/headers" || fail "no CSP"
grep -q '<title>gpcd</title>' "$work/page.html" || fail "GET / is not the dashboard"
curl -s --max-time 10 "$url/dashboard" | cmp -s - "$work/page.html" || fail "/dashboard differs from /"
curl -s --max-time 10 --unix-socket "$work/state/gpcd.sock" http://gpcd/ | cmp -s - "$work/page.html" || fail "no page on the unix socket"
# nothing loaded from elsewhere: no src/href, no CSS url(), no https
grep -Eq "(src|href)=|url\(|@import|https://" "$work/page.html" && fail "the page loads something: $(grep -Eo "(src|href)=[^ ]*|url\(|@import|https://" "$work/page.html")"
[[ $(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$url/status") == 401 ]] || fail "/status without a token"
[[ $(curl -s --max-time 10 -o /dev/null -w '%{http_code}' -X POST "$url/") == 401 ]] || fail "POST / served without a token"

# a job (through the TCP API, as the page's users would) and a hot GPU
export GPC_SOCKET=tcp://127.0.0.1:$port GPC_TOKEN=$token
tag=$RANDOM$RANDOM
# the job outlives the checks below, however slow Chromium is; the cleanup cancels it
id=$("$GPC" submit --name "<b>dash-$tag</b>" --priority high -- sleep 600 2>/dev/null | tail -1)
[[ $id =~ ^[0-9]+$ ]] || fail "submit printed '$id'"
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" show "$id" --json | grep -q "\"state\":\"running\""' || fail "job $id is not running"
busy=$("$GPC" show "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["assigned_gpus"][0])')
hot=$(( (busy + 1) % 4 ))
echo "$hot temperature 93" >"$work/sim"
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" top --once | grep -q temperature' || fail "the temperature alert never opened"

chrome() {
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/chrome-$1" --virtual-time-budget=4000 --window-size=1280,1000 "${@:2}" \
    2>>"$work/chrome.log"
}
chrome dom --dump-dom "$url/#token=$token" >"$work/dom.html" || fail "chromium failed: $(tail -3 "$work/chrome.log")"
python3 - "$work/dom.html" "$id" "$tag" "$hot" "$busy" <<'PY' || fail "page content (dom in $work/dom.html)"
import html.parser, sys
dom, job, tag, hot, busy = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.gpus, self.rows, self.alerts, self.text = [], {}, {}, [], {}
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        key = None
        if "gpu" in a.get("class", "").split() and "data-gpu" in a:
            key = ("gpu", int(a["data-gpu"]), a["class"])
        elif tag == "tr" and "data-job" in a:
            key = ("job", a["data-job"], a.get("data-state"))
        elif tag == "li" and "alert" in a.get("class", ""):
            key = ("alert", a.get("data-kind"), int(a.get("data-gpu", -1)))
        elif "id" in a:
            key = ("id", a["id"], a.get("style", ""))
        if tag in ("meta", "input", "br"):
            return
        self.stack.append(key)
        if key: self.text[key] = ""
    def handle_endtag(self, tag):
        if self.stack: self.stack.pop()
    def handle_data(self, data):
        for key in self.stack:
            if key: self.text[key] += data

p = Page()
p.feed(dom)
gpus = {k[1]: (k[2], v) for k, v in p.text.items() if k[0] == "gpu"}
assert sorted(gpus) == [0, 1, 2, 3], gpus
for g, (cls, text) in gpus.items():
    assert text.startswith(f"GPU {g} Simulated GPU"), text
    assert "80.0 GiB" in text, text
assert "busy" in gpus[busy][0] and "utilization 97%" in gpus[busy][1] and f"jobs {job}" in gpus[busy][1], gpus[busy]
assert "alerting" in gpus[hot][0] and "93 C" in gpus[hot][1], gpus[hot]
jobs = {k[1]: (k[2], v) for k, v in p.text.items() if k[0] == "job"}
assert job in jobs, jobs
state, text = jobs[job]
assert state == "running" and f"<b>dash-{tag}</b>" in text and "sleep 600" in text and "high" in text, jobs[job]
assert f"<b>dash-{tag}</b>" not in dom, "the job name was inserted as markup"
alerts = [(k, v) for k, v in p.text.items() if k[0] == "alert"]
assert any(k[1] == "temperature" and k[2] == hot and f"GPU {hot} at 93 C" in v for k, v in alerts), alerts
ids = {k[1]: (k[2], v) for k, v in p.text.items() if k[0] == "id"}
assert "simulated:4x80GB" in ids["provider"][1], ids["provider"]
assert ids["counts"][1].startswith("1 running, 0 waiting"), ids["counts"]
assert ids["status"][1].startswith("updated"), ids["status"]
PY
# the token was taken out of the address bar (still a fragment: never sent)
grep -q "$token" "$work/gpcd.log" && fail "the token reached gpcd's log"

# without the token the page says so and asks for it
chrome none --dump-dom "$url/" >"$work/dom-none.html" || fail "chromium failed"
grep -q 'id="status" class="error">token needed' "$work/dom-none.html" || fail "no 'token needed': $(grep -o 'id="status"[^<]*' "$work/dom-none.html")"
grep -q 'id="login" style="display: block;"' "$work/dom-none.html" || fail "the token form is not shown"
grep -q 'data-job=' "$work/dom-none.html" && fail "jobs shown without a token"

chrome shot --screenshot="$work/dashboard.png" "$url/#token=$token" || fail "chromium screenshot failed"
[[ $(head -c 8 "$work/dashboard.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "screenshot is not a PNG"
echo "screenshot: $work/dashboard.png"
"$GPC" cancel "$id" >/dev/null || fail "cancel job $id"
echo "ok"
