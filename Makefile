# `make run` and `make test` work on a fresh Debian 12 machine as root: both run `setup` first,
# which installs whatever is missing and is quick when everything is there (stamp files).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
# gcc, pkg-config and the -dev packages build python-qpid-proton's C core; it only enables TLS and
# SASL if pkg-config finds openssl and libsasl2 at build time. python3-venv/-dev serve Debian's python3.
# openssl: the TLS tests make their certificates with it. prometheus: its server scrapes a cluster in a test,
# and its promtool checks packaging/'s alert rules. iptables: the nemesis suite cuts nodes apart with it (tests/nemesis).
# g++ and libqpid-proton-cpp12-dev: a proton C++ client the redirect tests build (tests/cpp).
# chromium and chromium-driver: the web console's tests drive the pages in a real headless browser (tests/console).
APT_PACKAGES := python3-venv python3-dev gcc pkg-config libssl-dev libsasl2-dev openssl pacemaker corosync pcs resource-agents pacemaker-cli-utils libxml2-utils iproute2 iptables prometheus g++ libqpid-proton-cpp12-dev chromium chromium-driver
CONSOLE_NPM := haqueue/console/npm
CONSOLE_VENDOR := haqueue/console/static/vendor
PROTON := $(shell grep -o 'python-qpid-proton==[0-9.]*' pyproject.toml)
PROTON_OK := $(VENV)/bin/python -c 'import proton, sys; sys.exit(not (proton.SSL.present() and proton.SASL.extended()))'

.PHONY: setup apt build previous-release spark-archive dist run test quick clean

# bench/js: the benchmark's rhea clients, which the audit's failover tests also drive.
setup: $(VENV)/.installed $(VENV)/.compiled tests/js/node_modules/.installed bench/js/node_modules/.installed \
	$(CONSOLE_VENDOR)/.installed

# The hot path compiled by mypyc (setup.py) again whenever a source it may hold changed; until then
# haqueue runs it from source (haqueue/_compiled.py).
build: $(VENV)/.compiled

# Asks apt only for what is missing, so a set-up machine needs neither the network nor root here.
apt:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	command -v node >/dev/null && command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	command -v java >/dev/null || missing="$$missing default-jre-headless"; \
	test -f /usr/share/java/zookeeper.jar || missing="$$missing zookeeper"; \
	if [ -n "$$missing" ]; then \
		echo "apt-get install$$missing"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

$(VENV)/.installed: pyproject.toml setup.py haqueue/audit/_lines.c | apt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test,zk,spark]'
	@# pip may reuse a wheel it cached from a build without the -dev packages: rebuild it then.
	$(PROTON_OK) || $(VENV)/bin/pip install -q --no-cache-dir --force-reinstall --no-deps '$(PROTON)'
	@$(PROTON_OK) || { echo "python-qpid-proton was built without TLS or SASL" >&2; exit 1; }
	touch $@

# pip's editable install (.installed) compiles the hot path into the tree as this does: when the group's library is
# newer than every source here (haqueue/_compiled.py's test), that build is this one, and a second would take minutes
# of a core for the same code (a fresh set-up's case). After a build, the library and the stamp take the time the
# build started: a source touched but unchanged compiles to the same code, which the build does not rewrite, and the
# library must be newer than it; a source edited while the build ran is newer than both, so it is compiled next time.
$(VENV)/.compiled: $(VENV)/.installed $(wildcard haqueue/broker/*.py haqueue/broker/*.c haqueue/broker/*.h haqueue/store/*.py haqueue/ha/*.py) haqueue/shard/relayed_links.py haqueue/mirror/queue_mirror.py haqueue/audit/queue_observer.py $(wildcard haqueue/messaging/*.py) haqueue/audit/_lines.c
	@library=$$(ls haqueue/_hot_path__mypyc*.so 2>/dev/null | head -n 1); \
	if [ -n "$$library" ] && [ -z "$$(find $(filter-out $<,$^) -newer "$$library")" ]; then \
		echo "the hot path is compiled already: $$library is newer than its sources"; \
		touch $@; \
	else \
		started=$$(mktemp); \
		echo "$(VENV)/bin/python setup.py -q build_ext --inplace"; \
		$(VENV)/bin/python setup.py -q build_ext --inplace && \
		touch -r "$$started" haqueue/_hot_path__mypyc*.so $@; \
		built=$$?; rm -f "$$started"; exit $$built; \
	fi

# The web console's charting library (uPlot), from npm at build time into the package's static files (not in
# git): the pages need no network when they run.
$(CONSOLE_VENDOR)/.installed: $(CONSOLE_NPM)/node_modules/.installed
	mkdir -p $(CONSOLE_VENDOR)
	cp $(CONSOLE_NPM)/node_modules/uplot/dist/uPlot.iife.min.js $(CONSOLE_NPM)/node_modules/uplot/dist/uPlot.min.css $(CONSOLE_VENDOR)/
	touch $@

%/node_modules/.installed: %/package.json | apt
	cd $* && npm install --no-audit --no-fund
	touch $@

# A release into dist/ (packaging/README.md, "Building a release"): the sdist, then the wheel built from that sdist
# as pip builds it elsewhere, in a fresh environment with pyproject.toml's build requirements (from PyPI). The
# console's uPlot (not in git) must be there to be shipped.
dist: $(VENV)/.installed $(CONSOLE_VENDOR)/.installed
	$(VENV)/bin/pip install -q build
	rm -rf dist
	$(VENV)/bin/python -m build --outdir dist .

# ARGS: more `cluster up` options, e.g. make run ARGS="--config local.yaml" (README, "A hot-standby cluster")
run: setup
	$(VENV)/bin/haqueue cluster up --size 3 --dir ./cluster --public 127.0.0.1:5672 $(ARGS)

# The release the upgrade tests run beside this build (tests/releases.py), compiled once per checkout before the
# suite starts rather than in its background (about 2 minutes of a core the tests would share); quick once built.
previous-release: $(VENV)/.compiled
	$(VENV)/bin/python tests/releases.py

# The audit driver's class archive (tests/spark_archive.py): made before the suite, by one audit, if missing. After
# .compiled: the audit imports haqueue, whose compiled modules a build rewrites in place (a fresh set-up's pip
# install has compiled them already, so there it waits for nothing).
spark-archive: $(VENV)/.compiled
	$(VENV)/bin/python tests/spark_archive.py

# The set-up two steps at a time: npm's installs beside pip's, and the class archive's audit beside the previous
# release's build (a core each).
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target setup previous-release spark-archive
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup --durations=40

quick: setup
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup -m "not slow"

clean:
	rm -rf $(VENV) tests/js/node_modules bench/js/node_modules $(CONSOLE_NPM)/node_modules $(CONSOLE_VENDOR) build dist
	find haqueue -name '*.so' -delete
