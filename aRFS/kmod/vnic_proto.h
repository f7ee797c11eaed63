/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vnic management protocol, version 1: wire-format constants used by the
 * frame builders and the parsers (mgmt.c, ethtool.c). The normative text is
 * aRFS/PROTOCOL.md.
 */
#ifndef VNIC_PROTO_H
#define VNIC_PROTO_H

#define VNIC_ETH_P		0x88B5	/* IEEE local experimental 1 */
#define VNIC_MAGIC		0x7641	/* "vA" */
#define VNIC_VERSION		1
/* 3: knows the rule extension (types 7, 8) and the RSS extension (type 9) */
#define VNIC_DRIVER_VERSION	3

/* Sizes, in bytes. The management header follows the 14-byte Ethernet header. */
#define VNIC_HDR_LEN		16
#define VNIC_MGMT_MAX		1500	/* header + body */
#define VNIC_FRAME_MAX		(ETH_HLEN + VNIC_MGMT_MAX)
#define VNIC_HELLO_BODY		16
#define VNIC_CAPS_BODY		24
#define VNIC_CAPS_EXT_BODY	32	/* with features and max_rules */
#define VNIC_ADD_OP		44
#define VNIC_DEL_OP		4
#define VNIC_FLUSH_BODY		4
#define VNIC_ACK_FIXED		4
#define VNIC_RULE_OP		88
#define VNIC_RULE_DEL_OP	4
#define VNIC_RSS_OP		304

/* Most ops that fit in one frame of each type. */
#define VNIC_ADD_FIT		((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_ADD_OP)
#define VNIC_DEL_FIT		((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_DEL_OP)
#define VNIC_RULE_FIT		((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_RULE_OP)
#define VNIC_RULE_DEL_FIT	((VNIC_MGMT_MAX - VNIC_HDR_LEN) / VNIC_RULE_DEL_OP)

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
#define VNIC_CAPS_OFF_FEATURES	24	/* 32-byte CAPS only */
#define VNIC_CAPS_OFF_MAX_RULES	28

/* CAPS features */
#define VNIC_FEAT_RULES		BIT(0)	/* RULE_SET, RULE_DEL */
#define VNIC_FEAT_RSS		BIT(1)	/* RSS_SET */
#define VNIC_FEAT_KNOWN		(VNIC_FEAT_RULES | VNIC_FEAT_RSS)

/* RULE_SET op: flow and action codes */
enum vnic_rule_flow {
	VNIC_RF_TCP4	= 1,
	VNIC_RF_UDP4	= 2,
	VNIC_RF_IP4	= 3,
	VNIC_RF_TCP6	= 4,
	VNIC_RF_UDP6	= 5,
	VNIC_RF_IP6	= 6,
};

enum vnic_rule_action {
	VNIC_RA_QUEUE	= 1,
	VNIC_RA_DROP	= 2,
	VNIC_RA_CONTEXT	= 3,
};

/* RSS_SET op */
#define VNIC_RSS_DEFAULT_INDIR	BIT(0)
#define VNIC_RSS_DEFAULT_KEY	BIT(1)
#define VNIC_RSS_HFUNC_TOP	1
#define VNIC_RSS_KEY_LEN	40
#define VNIC_RSS_INDIR_LEN	128

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
	VNIC_T_RULE_SET	= 7,
	VNIC_T_RULE_DEL	= 8,
	VNIC_T_RSS_SET	= 9,
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
