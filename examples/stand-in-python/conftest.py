"""Starts the stand-in (or uses one already running), points Stripe's SDK at it, and resets it
before each test.

PROCESSOR_SIM names the binary to start (default: ../../target/debug/processor-sim from this
folder); STAND_IN_URL, if set, is a stand-in already running, which is used as it is.
"""

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import stripe

HERE = Path(__file__).resolve().parent
# This suite's account at the stand-in: a reset of this key forgets only what it made.
API_KEY = "sk_test_example_python"


class StandIn:
    """The stand-in's own routes (`/_sim/...`, `/healthz`), outside Stripe's API."""

    def __init__(self, url):
        self.url = url

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def reset(self, api_key=None):
        """Forgets everything, or only what `api_key` made."""
        return self.call("POST", "/_sim/reset", {"api_key": api_key} if api_key else {})

    def aim(self, fault, **rule):
        """Aims `fault` at the next request(s) that match `rule` (method, path, match, times, …)."""
        return self.call("POST", "/_sim/faults/aimed", {"fault": fault, **rule})

    def aimed(self):
        return self.call("GET", "/_sim/faults/aimed")["data"]

    def authenticate(self, intent_id, outcome):
        """Completes (`"complete"`) or fails (`"fail"`) a pending 3-D Secure authentication, as
        the customer would on Stripe's test page; answers the PaymentIntent."""
        path = f"/_sim/payment_intents/{intent_id}/authenticate"
        return self.call("POST", path, {"outcome": outcome})

    def advance_clock(self, seconds):
        return self.call("POST", "/_sim/clock", {"advance_s": seconds})

    def stats(self):
        return self.call("GET", "/_sim/stats")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, process=None, deadline_s=20):
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                if json.load(response) == {"status": "ok"}:
                    return
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            pytest.exit(f"processor-sim exited with {process.returncode}", returncode=1)
        time.sleep(0.05)
    pytest.exit(f"the stand-in at {url} did not become healthy in {deadline_s} s", returncode=1)


@pytest.fixture(scope="session")
def stand_in():
    url = os.environ.get("STAND_IN_URL")
    process = None
    if url:
        url = url.rstrip("/")
    else:
        binary = os.environ.get("PROCESSOR_SIM", str(HERE / "../../target/debug/processor-sim"))
        if not os.access(binary, os.X_OK):
            pytest.exit(f"no processor-sim at {binary} (cargo build -p processor-sim)", returncode=1)
        port = free_port()
        process = subprocess.Popen(
            [binary, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        stripe.api_key = API_KEY
        stripe.api_base = url
        # The SDK retries a broken connection with the same Idempotency-Key.
        stripe.max_network_retries = 2
        stripe.enable_telemetry = False
        yield StandIn(url)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture(autouse=True)
def sim(stand_in):
    """Each test starts from an empty stand-in."""
    stand_in.reset()
    return stand_in
