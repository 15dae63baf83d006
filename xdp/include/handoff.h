/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * handoff.h - the note XDP leaves in a packet's metadata when it hands the
 * packet to the TC ingress program on the same device to finish sending
 * (forward.h writes it, tc_nic.c reads it).
 */
#ifndef XDPLB_HANDOFF_H
#define XDPLB_HANDOFF_H

#include "common.h"

/* Metadata XDP leaves in front of a packet it hands to TC. */
struct xdp_handoff {
	__u32 magic;   /* XDP_HANDOFF_MAGIC */
	__u32 ifindex; /* egress device chosen by the FIB */
};

#define XDP_HANDOFF_MAGIC 0x784c4246 /* "xLBF" */

#endif /* XDPLB_HANDOFF_H */
