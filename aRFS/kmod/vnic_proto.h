/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vnic management protocol, version 1: wire-format constants used by the
 * frame builders and the parser (mgmt.c). The normative text is
 * aRFS/PROTOCOL.md.
 */
#ifndef VNIC_PROTO_H
#define VNIC_PROTO_H

#define VNIC_ETH_P		0x88B5	/* IEEE local experimental 1 */
#define VNIC_MAGIC		0x7641	/* "vA" */
#define VNIC_VERSION		1
#define VNIC_DRIVER_VERSION	1

/* Sizes, in bytes. The management header follows the 14-byte Ethernet header. */
#define VNIC_HDR_LEN		16
#define VNIC_MGMT_MAX		1500	/* header + body */
#define VNIC_FRAME_MAX		(ETH_HLEN + VNIC_MGMT_MAX)
#define VNIC_HELLO_BODY		16
#define VNIC_CAPS_BODY		24
#define VNIC_ADD_OP		44
#define VNIC_DEL_OP		4
#define VNIC_FLUSH_BODY		4
#define VNIC_ACK_FIXED		4

/* Most ops that fit in one frame of each type. */
#define VNIC_ADD_FIT		((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_ADD_OP)
#define VNIC_DEL_FIT		((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_DEL_OP)

/*
 * HELLO goes to this link-local group address (IEEE 802.1Q's "nearest
 * bridge" group, 01-80-C2-00-00-0E): no 802.1D/Q bridge forwards it, so a
 * HELLO never leaves the link. Everything after CAPS is unicast to the
 * address the CAPS came from.
 */
#define VNIC_HELLO_GROUP	{ 0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e }

/* Body offsets of the session fields (from the start of the body). */
#define VNIC_HELLO_OFF_NONCE	4	/* per-session nonce the device echoes */
#define VNIC_HELLO_OFF_MAC	8
#define VNIC_CAPS_OFF_NONCE	20	/* the nonce of the HELLO answered */

/* Header field offsets (from the start of the management header). */
#define VNIC_OFF_MAGIC		0
#define VNIC_OFF_VERSION	2
#define VNIC_OFF_TYPE		3
#define VNIC_OFF_SEQ		4
#define VNIC_OFF_GEN		8
#define VNIC_OFF_COUNT		12
#define VNIC_OFF_BODYLEN	14

enum vnic_msg_type {
	VNIC_T_HELLO	= 1,
	VNIC_T_CAPS	= 2,
	VNIC_T_ADD	= 3,
	VNIC_T_DEL	= 4,
	VNIC_T_FLUSH	= 5,
	VNIC_T_ACK	= 6,
};

/* DEL / FLUSH reasons. */
enum vnic_del_reason {
	VNIC_R_EXPIRED	= 1,
	VNIC_R_IDLE	= 2,
	VNIC_R_REPLACED	= 3,
	VNIC_R_FLUSH	= 4,
	VNIC_R_UNLOAD	= 5,
	VNIC_R_AGED	= 6,	/* a fixed lifetime ended (expiry=ice, UDP) */
	VNIC_R_MAX	= 6,
};

/* Per-op ACK status codes. */
enum vnic_op_status {
	VNIC_S_OK		= 0,
	VNIC_S_TABLE_FULL	= 1,
	VNIC_S_BUCKET_FULL	= 2,
	VNIC_S_BAD_QUEUE	= 3,
	VNIC_S_BAD_KEY		= 4,
	VNIC_S_INJECTED		= 5,
	VNIC_S_UNKNOWN_ID	= 6,
	VNIC_S_BAD_ID		= 7,
	VNIC_S_MAX		= 7,
};

/* Malformed-frame codes (ACK frame_status); 0 is ok. */
#define VNIC_FS_MAX		10

#define VNIC_NO_FILTER		0xFFFF	/* the kernel's RPS_NO_FILTER */
#define VNIC_MAX_ID		0xFFFE

#define VNIC_WINDOW		64	/* most unacked request frames */
#define VNIC_MAX_RETRIES	5	/* then HELLO again (session restart) */

#endif /* VNIC_PROTO_H */
