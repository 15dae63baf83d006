#!/usr/bin/env bash
# pktgen.sh - drive the kernel packet generator (/proc/net/pktgen) for the
# xdplb perf suite, or by hand on real hardware.
#
# Options follow the conventions of the kernel's samples/pktgen scripts:
#   -i DEV     output interface (required; a real NIC name on real hardware)
#   -s BYTES   packet size (default 60)
#   -d IP      destination IP, a range FIRST-LAST or a CIDR (required)
#   -m MAC     destination MAC address (required)
#   -p PORT    destination UDP port, or a range FIRST-LAST (default 9)
#   -t N       threads to start, one per CPU (default 1)
#   -f N       index of the first thread's CPU (default 0)
#   -c N       SKB clones sent before a new SKB is allocated (default 0)
#   -n N       packets to send per thread, 0 means until stopped (default 100000)
#   -b N       hardware-level burst of SKBs (default 1)
#   -w NS      delay between packets in ns (default 0)
#   -v         verbose: print the result of every thread
#   -x         debug: print every command written to /proc/net/pktgen
# Additions for flow-oriented tests:
#   -S IP      source IP, or a range FIRST-LAST (default: DEV's address)
#   -P PORT    source UDP port, or a range FIRST-LAST (default 9)
#   -F N       concurrent flows (pktgen "flows"), 0 for none (default 0)
#   -L N       packets per flow before moving on (pktgen "flowlen", default 1)
#   -R         randomise source ports and addresses within their ranges
#              (default: count through them, one step per packet)
#
# The script writes the configuration, starts the threads, waits until they
# finish (or until another process writes "stop" to /proc/net/pktgen/pgctrl)
# and prints one line per thread: "DEV@CPU sent N errors E". Run it in the
# network namespace of DEV: pktgen is per network namespace.
set -euo pipefail

PGDIR=/proc/net/pktgen
DEV="" PKT_SIZE=60 DEST_IP="" DST_MAC="" DST_PORT=9 THREADS=1 F_THREAD=0
CLONE_SKB=0 COUNT=100000 BURST=1 DELAY=0 VERBOSE=0 DEBUG=0
SRC_IP="" SRC_PORT=9 FLOWS=0 FLOWLEN=1 RANDOM_SRC=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

while getopts "i:s:d:m:p:t:f:c:n:b:w:vxS:P:F:L:Rh" opt; do
	case "$opt" in
	i) DEV=$OPTARG ;;
	s) PKT_SIZE=$OPTARG ;;
	d) DEST_IP=$OPTARG ;;
	m) DST_MAC=$OPTARG ;;
	p) DST_PORT=$OPTARG ;;
	t) THREADS=$OPTARG ;;
	f) F_THREAD=$OPTARG ;;
	c) CLONE_SKB=$OPTARG ;;
	n) COUNT=$OPTARG ;;
	b) BURST=$OPTARG ;;
	w) DELAY=$OPTARG ;;
	v) VERBOSE=1 ;;
	x) DEBUG=1 ;;
	S) SRC_IP=$OPTARG ;;
	P) SRC_PORT=$OPTARG ;;
	F) FLOWS=$OPTARG ;;
	L) FLOWLEN=$OPTARG ;;
	R) RANDOM_SRC=1 ;;
	*) usage ;;
	esac
done
[[ -n $DEV && -n $DEST_IP && -n $DST_MAC ]] || usage
if [[ ! -d $PGDIR ]]; then
	echo "pktgen.sh: $PGDIR does not exist: pktgen is not built into or loaded in this kernel" >&2
	exit 3
fi

# pgset FILE CMD: write one pktgen command and check pktgen accepted it.
pgset() {
	local file=$1 cmd=$2
	if ((DEBUG)); then echo "pktgen.sh: $file <- $cmd" >&2; fi
	echo "$cmd" >"$file"
	if [[ $file != "$PGDIR/pgctrl" ]] && ! grep -q "^Result: OK" "$file"; then
		echo "pktgen.sh: $file rejected \"$cmd\": $(grep '^Result:' "$file")" >&2
		exit 1
	fi
}

# range VALUE: "FIRST LAST" from FIRST-LAST, a CIDR, or a single value.
range() {
	local v=$1
	if [[ $v == */* ]]; then
		local ip=${v%/*} bits=${v#*/} a b c d n first last
		IFS=. read -r a b c d <<<"$ip"
		n=$(((a << 24) | (b << 16) | (c << 8) | d))
		first=$((n & ~((1 << (32 - bits)) - 1) & 0xffffffff))
		last=$((first | ((1 << (32 - bits)) - 1)))
		printf '%d.%d.%d.%d %d.%d.%d.%d\n' $((first >> 24 & 255)) $((first >> 16 & 255)) $((first >> 8 & 255)) $((first & 255)) \
			$((last >> 24 & 255)) $((last >> 16 & 255)) $((last >> 8 & 255)) $((last & 255))
	elif [[ $v == *-* ]]; then
		echo "${v%-*} ${v#*-}"
	else
		echo "$v $v"
	fi
}

read -r DST_MIN DST_MAX < <(range "$DEST_IP")
read -r UDP_DST_MIN UDP_DST_MAX < <(range "$DST_PORT")
read -r UDP_SRC_MIN UDP_SRC_MAX < <(range "$SRC_PORT")
if [[ -n $SRC_IP ]]; then
	read -r SRC_MIN SRC_MAX < <(range "$SRC_IP")
fi

devices=()
for ((t = F_THREAD; t < F_THREAD + THREADS; t++)); do
	thread=$PGDIR/kpktgend_$t
	[[ -e $thread ]] || { echo "pktgen.sh: no pktgen thread for CPU $t" >&2; exit 1; }
	pgset "$thread" "rem_device_all"
	pgset "$thread" "add_device $DEV@$t"
	devices+=("$DEV@$t")
	f=$PGDIR/$DEV@$t
	pgset "$f" "flag QUEUE_MAP_CPU"
	pgset "$f" "count $COUNT"
	pgset "$f" "clone_skb $CLONE_SKB"
	pgset "$f" "pkt_size $PKT_SIZE"
	pgset "$f" "burst $BURST"
	pgset "$f" "delay $DELAY"
	pgset "$f" "dst_mac $DST_MAC"
	pgset "$f" "dst_min $DST_MIN"
	pgset "$f" "dst_max $DST_MAX"
	pgset "$f" "udp_dst_min $UDP_DST_MIN"
	pgset "$f" "udp_dst_max $UDP_DST_MAX"
	pgset "$f" "udp_src_min $UDP_SRC_MIN"
	pgset "$f" "udp_src_max $UDP_SRC_MAX"
	if [[ -n $SRC_IP ]]; then
		pgset "$f" "src_min $SRC_MIN"
		pgset "$f" "src_max $SRC_MAX"
	fi
	if ((RANDOM_SRC)); then
		pgset "$f" "flag UDPSRC_RND"
		pgset "$f" "flag IPSRC_RND"
	fi
	if ((FLOWS > 0)); then
		pgset "$f" "flows $FLOWS"
		pgset "$f" "flowlen $FLOWLEN"
		pgset "$f" "flag FLOW_SEQ"
	fi
done

# Blocks until every thread has sent COUNT packets or "stop" is written.
pgset "$PGDIR/pgctrl" "start"

for d in "${devices[@]}"; do
	sofar=$(sed -n 's/.*pkts-sofar: \([0-9]*\).*/\1/p' "$PGDIR/$d" | head -n1)
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$PGDIR/$d" | head -n1)
	echo "$d sent ${sofar:-0} errors ${errors:-0}"
	if ((VERBOSE)); then grep '^Result:' "$PGDIR/$d" >&2; fi
done
for ((t = F_THREAD; t < F_THREAD + THREADS; t++)); do
	echo "rem_device_all" >"$PGDIR/kpktgend_$t"
done
