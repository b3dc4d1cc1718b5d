#!/bin/sh
# Slurm epilog: append `gpumon report` for the job that just ended to the job's output file,
# as jobstats' summary is, so the user reads why the GPUs waited beside the job's own output,
# and keep the report for later (`gpumon report --job ID` reads it back after Prometheus has
# dropped the job's series): in the job's AdminComment where Slurm takes it, else as a file
# per job in GPUMON_REPORT_STORE.
#
# It does not hold the node: it checks what it must, starts the report in the background
# (detached, in a session of its own, bounded by GPUMON_REPORT_DELAY + GPUMON_REPORT_TIMEOUT)
# and returns at once, so slurmd can give the node to the next job.
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/gpumon-epilog.sh
#     Runs on every node of the job; only the batch host reports (one report per job).
#   or:          EpilogSlurmctld=/etc/slurm/gpumon-epilog.sh
#     Runs once, on the controller (which then needs gpumon and the users' file systems).
#
# Settings: shell variables in /etc/default/gpumon-report, or the environment.
#   GPUMON_PROMETHEUS      Prometheus' URL (required), e.g. http://prometheus:9090
#   GPUMON_HTTP_CONFIG     its --http.config.file (basic auth, bearer token, TLS), if any
#   GPUMON_BIN             gpumon (default /usr/local/bin/gpumon: `gpumon deploy` writes its own)
#   GPUMON_REPORT_DELAY    seconds to wait first, so Prometheus scrapes the job's last
#                          seconds (default 20: one scrape interval and a little)
#   GPUMON_REPORT_TIMEOUT  seconds the report may take (default 60)
#   GPUMON_REPORT_STORE    folder of kept reports, one file per job, where the AdminComment
#                          cannot take it (default /var/lib/gpumon/reports; a folder
#                          shared with the login nodes lets users read it there)
#   SCONTROL               scontrol (default: found on PATH)
#
# It never fails: a failing epilog drains the node.  What went wrong is written where the
# report would have gone.  The output file is written as the job's user (setpriv, when run
# as root), and only if it is a regular file of that user: never through a link.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
[ -r /etc/default/gpumon-report ] && . /etc/default/gpumon-report

GPUMON_BIN=${GPUMON_BIN:-/usr/local/bin/gpumon}
GPUMON_REPORT_DELAY=${GPUMON_REPORT_DELAY:-20}
GPUMON_REPORT_TIMEOUT=${GPUMON_REPORT_TIMEOUT:-60}
SCONTROL=${SCONTROL:-scontrol}

field() {  # field NAME: the value of NAME=... in the job's record (one line, -o)
    printf '%s\n' "$job" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

append() {  # append FILE: stdin to FILE, as the job's user
    if [ "$(id -u)" = 0 ] && [ -n "$uid" ] && [ -n "$gid" ]; then
        setpriv --reuid="$uid" --regid="$gid" --clear-groups sh -c 'cat >> "$1"' sh "$1"
    else
        cat >> "$1"
    fi
}

main() {
    [ -n "$SLURM_JOB_ID" ] || return 0
    job=$("$SCONTROL" -o show job "$SLURM_JOB_ID" 2>/dev/null) || return 0
    batch=$(field BatchHost)
    # A node epilog runs on every node of the job: report once, from the batch host.
    if [ -n "$SLURMD_NODENAME" ] && [ -n "$batch" ] && [ "$SLURMD_NODENAME" != "$batch" ]; then
        return 0
    fi
    out=$(field StdOut)
    uid=$(field UserId | sed -n 's/.*(\([0-9]*\))$/\1/p')
    gid=$(field GroupId | sed -n 's/.*(\([0-9]*\))$/\1/p')
    # Only a regular file the job's user owns, never a link (it is root who writes).
    [ -n "$out" ] && [ -f "$out" ] && [ ! -L "$out" ] || return 0
    if [ -n "$uid" ] && [ "$(stat -c %u "$out")" != "$uid" ]; then
        return 0
    fi
    start=$(field StartTime)
    since=""
    case "$start" in
        [0-9][0-9][0-9][0-9]-*) since="--since=$start" ;;
    esac
    # Detached: this script again, in a session of its own (signals to the epilog's process
    # group do not reach it), with nothing inherited that slurmd would wait on.
    export SLURM_JOB_ID GPUMON_PROMETHEUS GPUMON_HTTP_CONFIG GPUMON_BIN GPUMON_REPORT_DELAY \
        GPUMON_REPORT_TIMEOUT GPUMON_REPORT_STORE
    GPUMON_OUT=$out GPUMON_UID=$uid GPUMON_GID=$gid GPUMON_SINCE=$since
    export GPUMON_OUT GPUMON_UID GPUMON_GID GPUMON_SINCE
    if command -v setsid >/dev/null 2>&1; then
        setsid /bin/sh "$0" --report-later </dev/null >/dev/null 2>&1 &
    else
        /bin/sh "$0" --report-later </dev/null >/dev/null 2>&1 &
    fi
}

report_later() {  # the report, once Prometheus has scraped the job's last seconds
    out=$GPUMON_OUT uid=$GPUMON_UID gid=$GPUMON_GID
    sleep "$GPUMON_REPORT_DELAY"
    {
        echo
        echo "==== gpumon report for job $SLURM_JOB_ID ===="
        if [ -z "$GPUMON_PROMETHEUS" ]; then
            echo "gpumon: the epilog has no GPUMON_PROMETHEUS (set it in /etc/default/gpumon-report)"
        else
            set -- --prometheus "$GPUMON_PROMETHEUS" --job "$SLURM_JOB_ID" --keep
            [ -n "$GPUMON_SINCE" ] && set -- "$@" "$GPUMON_SINCE"
            [ -n "$GPUMON_HTTP_CONFIG" ] && set -- "$@" --http.config.file "$GPUMON_HTTP_CONFIG"
            [ -n "$GPUMON_REPORT_STORE" ] && set -- "$@" --store "$GPUMON_REPORT_STORE"
            timeout "$GPUMON_REPORT_TIMEOUT" "$GPUMON_BIN" report "$@" 2>&1
        fi
    } | append "$out"
}

if [ "$1" = --report-later ]; then
    report_later || true
    exit 0
fi
main || true
exit 0
