#!/bin/sh
# Headless Chromium is used by the report test (tests open the HTML report and screenshot it).
# Installs Debian's package when we are root; otherwise says how, and the test skips.
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "warning: could not install chromium; the report screenshot test will be skipped"
else
    echo "note: install Debian's 'chromium' package to run the report screenshot test"
fi
exit 0
