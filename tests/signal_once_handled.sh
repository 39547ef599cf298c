#!/bin/sh
# Runs a command, sends it SIGNAL once it has installed its own handler for it (the signal's bit
# in /proc/PID/status's SigCgt: for flowtrain, once the run has started), and exits with the
# command's status. Waiting for the handler, not a fixed time, keeps a slow start (under TSan,
# on a busy machine) from meeting the default action instead.
#   tests/signal_once_handled.sh TERM flowtrain run demo.yaml
signal=$1
shift
case $signal in
  INT) number=2 ;;
  TERM) number=15 ;;
  *) echo "signal_once_handled: INT or TERM, not $signal" >&2; exit 2 ;;
esac
"$@" &
pid=$!
tries=0
while :; do
  mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null)
  [ -n "$mask" ] || break  # the command already ended
  # The low 4 hex digits hold signals 1-16; SIGINT and SIGTERM are among them.
  [ $(( (0x$(printf '%s' "$mask" | tail -c 4) >> (number - 1)) & 1 )) -eq 1 ] && break
  tries=$((tries + 1))
  [ $tries -lt 1200 ] || break  # 2 minutes: send it anyway
  sleep 0.1
done
kill "-$signal" "$pid" 2>/dev/null
wait "$pid"
