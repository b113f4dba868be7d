# Shared helpers for the ops/ scripts. Sourced, never executed.
# Servers are fetched once into a cache outside the work tree (so a fresh clone
# reuses them) and run with their data under the git-ignored .data/ folder.
set -euo pipefail

OPS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$OPS_DIR")
DATA_DIR=${SCHEDULER_DATA_DIR:-$REPO_DIR/.data}
CACHE_DIR=${SCHEDULER_CACHE_DIR:-$HOME/.cache/scheduler-ops}
# Cassandra 5.0 runs on JDK 11 or 17 only; newer JDKs remove the SecurityManager
# it installs, so we never take whatever `java` is first on PATH.
JAVA17_HOME=${JAVA17_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}
MAVEN_DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[$(basename "$0")] $*" >&2; }

java17() {
  local j="$JAVA17_HOME/bin/java"
  [ -x "$j" ] || die "JDK 17 not found at $JAVA17_HOME; install openjdk-17-jdk-headless or set JAVA17_HOME"
  "$j" -version 2>&1 | grep -q 'version "17' || die "$j is not JDK 17; set JAVA17_HOME to a JDK 17"
  echo "$j"
}

# maven_fetch DEST G:A:V [G:A:V ...]: copy the artifacts and their runtime
# dependencies into DEST/lib. A finished fetch leaves DEST/.complete, and a second
# call returns at once without touching the network.
maven_fetch() {
  local dest=$1; shift
  # The marker holds the artifact list, so changing the list refetches.
  [ -f "$dest/.complete" ] && [ "$(cat "$dest/.complete")" = "$*" ] && return 0
  command -v mvn >/dev/null || die "mvn not found; install maven (apt-get install maven)"
  local tmp; tmp=$(mktemp -d)
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    echo '<groupId>local.scheduler</groupId><artifactId>fetch</artifactId><version>1</version><dependencies>'
    local gav g a v
    for gav in "$@"; do
      IFS=: read -r g a v <<<"$gav"
      echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
    done
    echo '</dependencies></project>'
  } >"$tmp/pom.xml"
  log "fetching $* ..."
  local t0=$SECONDS
  rm -rf "$dest" && mkdir -p "$dest"
  if ! (cd "$tmp" && mvn -B -q "$MAVEN_DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime \
        -DoutputDirectory="$dest/lib" >"$tmp/mvn.log" 2>&1); then
    tail -20 "$tmp/mvn.log" >&2
    die "maven fetch of $* failed (log above)"
  fi
  echo "$*" >"$dest/.complete"
  log "fetched $(ls "$dest/lib" | wc -l) jars, $(du -sh "$dest/lib" | cut -f1), in $((SECONDS - t0)) s"
  rm -rf "$tmp"
}

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pidfile NAME PIDFILE: TERM, wait up to 30 s, then KILL.
stop_pidfile() {
  local name=$1 pidfile=$2
  if ! pid_alive "$pidfile"; then log "$name: not running"; rm -f "$pidfile"; return 0; fi
  local pid; pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -f "$pidfile"
  log "$name: stopped"
}

# now_ms: wall clock in milliseconds, for start-up timings.
now_ms() { date +%s%3N; }
