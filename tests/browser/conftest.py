"""JupyterLab in headless Chromium (Debian's /usr/bin/chromium driven by Playwright for Python).

Recipe verified in ../shared/notes/browser-testing.md. Lab serves a temporary copy of the notebooks (Lab
autosaves open notebooks; the repository's copies must stay output-free). Under CI=true a missing browser or playwright fails
the tests; elsewhere they are skipped with the reason. Screenshots, console logs and the Lab log go to
test-artifacts/browser/ (gitignored; override with NB_ARTIFACTS).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("RECTOOLKIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("NB_ARTIFACTS", ROOT / "test-artifacts")) / "browser"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage"]


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"browser test needs {reason} (CI=true, so this is a failure, not a skip)")
    pytest.skip(f"browser test skipped: {reason}")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def lab_server(artifacts):
    """A JupyterLab server on 127.0.0.1 serving a scratch folder; yields (base_url, token, root folder)."""
    tmp = Path(tempfile.mkdtemp(prefix="rtk-lab-"))
    (tmp / "root").mkdir()
    token = secrets.token_hex(16)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp / "cfg/labconfig").mkdir(parents=True)
    (tmp / "cfg/labconfig/page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "cfg"), JUPYTER_DATA_DIR=str(tmp / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "rt"), PYTHONPATH=str(ROOT))
    log_path = artifacts / "lab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", "--allow-root", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp / 'root'}", f"--LabApp.workspaces_dir={tmp / 'ws'}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         # as under `make lab`: saving a notebook whose cells are unchanged leaves its file as it was
         "--ContentsManager.pre_save_hook=rectoolkit.widgets.clean_notebooks.keep_notebooks_clean"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"JupyterLab exited at start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        else:
            pytest.fail(f"JupyterLab did not answer in 120 s:\n{log_path.read_text()[-3000:]}")
        yield base, token, tmp / "root"
    finally:
        try:
            request = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST", data=b"")
            urllib.request.urlopen(request, timeout=10)
            proc.wait(30)
        except Exception:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        _missing(f"a Chromium binary at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package (pip install playwright; no browser download needed)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROME_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, artifacts, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    messages = []
    page.on("console", lambda msg: messages.append(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda exc: messages.append(f"[pageerror] {exc}"))
    page.console_messages = messages
    yield page
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    (artifacts / f"{name}.console.txt").write_text("\n".join(messages))
    try:
        page.screenshot(path=str(artifacts / f"{name}.final.png"), full_page=True)
    except Exception:
        pass
    context.close()
