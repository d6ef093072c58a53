#!/usr/bin/env bash
# Stop the SeaweedFS that .ci/s3-up.sh started (its data folder is kept).
DIR=${DOBRUSHIN_S3_DIR:-/tmp/dobrushin-seaweedfs}
if [[ -f $DIR/weed.pid ]]; then
    pid=$(cat "$DIR/weed.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$DIR/weed.pid"
fi
echo "s3-down: stopped"
