/*
 * Prints what rdma-core's <infiniband/mlx4dv.h> says about the mlx4 hardware layouts, for
 * tests/mlx4dv_layout.rs to compare with portverbs-mlx4's own definitions.
 *
 * Output: one record per line, "KEY VALUE...", where KEY is
 *   size  STRUCT              -> sizeof
 *   field STRUCT.FIELD        -> offset and size of the field
 *   const NAME                -> value of a constant (hex)
 *   bytes NAME                -> bytes (hex) a header helper or a header struct produced
 *   value NAME                -> a value read back through the header's struct definitions
 *
 * Only the hardware layouts and constants portverbs-mlx4 also defines are printed; the test
 * fails on any record it has no counterpart for, and on any counterpart the header lacks.
 */
#define _DEFAULT_SOURCE /* be32toh and friends under -std=c11 */

#include <infiniband/mlx4dv.h>

#include <endian.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SIZE(s) printf("size %s %zu\n", #s, sizeof(struct s))
#define FIELD(s, f)                                                                        \
	printf("field %s.%s %zu %zu\n", #s, #f, offsetof(struct s, f),                     \
	       sizeof(((struct s *)0)->f))
#define CONST(c) printf("const %s 0x%llx\n", #c, (unsigned long long)(c))
#define VALUE(name, v) printf("value %s 0x%llx\n", name, (unsigned long long)(v))

static void bytes(const char *name, const void *p, size_t n)
{
	const uint8_t *b = p;
	printf("bytes %s", name);
	for (size_t i = 0; i < n; i++)
		printf(" %02x", b[i]);
	printf("\n");
}

static void structs(void)
{
	SIZE(mlx4_wqe_ctrl_seg);
	FIELD(mlx4_wqe_ctrl_seg, owner_opcode);
	FIELD(mlx4_wqe_ctrl_seg, reserved);
	FIELD(mlx4_wqe_ctrl_seg, fence_size);
	FIELD(mlx4_wqe_ctrl_seg, bf_qpn);
	FIELD(mlx4_wqe_ctrl_seg, srcrb_flags);
	FIELD(mlx4_wqe_ctrl_seg, srcrb_flags16);
	FIELD(mlx4_wqe_ctrl_seg, imm);

	SIZE(mlx4_av);
	FIELD(mlx4_av, port_pd);
	FIELD(mlx4_av, reserved1);
	FIELD(mlx4_av, g_slid);
	FIELD(mlx4_av, dlid);
	FIELD(mlx4_av, reserved2);
	FIELD(mlx4_av, gid_index);
	FIELD(mlx4_av, stat_rate);
	FIELD(mlx4_av, hop_limit);
	FIELD(mlx4_av, sl_tclass_flowlabel);
	FIELD(mlx4_av, dgid);

	SIZE(mlx4_wqe_datagram_seg);
	FIELD(mlx4_wqe_datagram_seg, av);
	FIELD(mlx4_wqe_datagram_seg, dqpn);
	FIELD(mlx4_wqe_datagram_seg, qkey);
	FIELD(mlx4_wqe_datagram_seg, vlan);
	FIELD(mlx4_wqe_datagram_seg, mac);

	SIZE(mlx4_wqe_data_seg);
	FIELD(mlx4_wqe_data_seg, byte_count);
	FIELD(mlx4_wqe_data_seg, lkey);
	FIELD(mlx4_wqe_data_seg, addr);

	SIZE(mlx4_wqe_inline_seg);
	FIELD(mlx4_wqe_inline_seg, byte_count);

	SIZE(mlx4_wqe_srq_next_seg);
	FIELD(mlx4_wqe_srq_next_seg, reserved1);
	FIELD(mlx4_wqe_srq_next_seg, next_wqe_index);
	FIELD(mlx4_wqe_srq_next_seg, reserved2);

	SIZE(mlx4_wqe_raddr_seg);
	FIELD(mlx4_wqe_raddr_seg, raddr);
	FIELD(mlx4_wqe_raddr_seg, rkey);
	FIELD(mlx4_wqe_raddr_seg, reserved);

	SIZE(mlx4_wqe_atomic_seg);
	FIELD(mlx4_wqe_atomic_seg, swap_add);
	FIELD(mlx4_wqe_atomic_seg, compare);

	SIZE(mlx4_wqe_bind_seg);
	FIELD(mlx4_wqe_bind_seg, flags1);
	FIELD(mlx4_wqe_bind_seg, flags2);
	FIELD(mlx4_wqe_bind_seg, new_rkey);
	FIELD(mlx4_wqe_bind_seg, lkey);
	FIELD(mlx4_wqe_bind_seg, addr);
	FIELD(mlx4_wqe_bind_seg, length);

	SIZE(mlx4_wqe_local_inval_seg);
	FIELD(mlx4_wqe_local_inval_seg, reserved1);
	FIELD(mlx4_wqe_local_inval_seg, mem_key);
	/* reserved2 (4 B at 12) and reserved3 (16 B at 16) are one 20-byte pad on our side. */

	SIZE(mlx4_cqe);
	FIELD(mlx4_cqe, vlan_my_qpn);
	FIELD(mlx4_cqe, immed_rss_invalid);
	FIELD(mlx4_cqe, g_mlpath_rqpn);
	FIELD(mlx4_cqe, sl_vid);
	FIELD(mlx4_cqe, rlid);
	FIELD(mlx4_cqe, ts_47_16);
	FIELD(mlx4_cqe, status);
	FIELD(mlx4_cqe, byte_cnt);
	FIELD(mlx4_cqe, wqe_index);
	FIELD(mlx4_cqe, checksum);
	FIELD(mlx4_cqe, reserved3);
	FIELD(mlx4_cqe, ts_15_8);
	FIELD(mlx4_cqe, ts_7_0);
	FIELD(mlx4_cqe, owner_sr_opcode);

	SIZE(mlx4_err_cqe);
	FIELD(mlx4_err_cqe, vlan_my_qpn);
	FIELD(mlx4_err_cqe, reserved1);
	FIELD(mlx4_err_cqe, wqe_index);
	FIELD(mlx4_err_cqe, vendor_err);
	FIELD(mlx4_err_cqe, syndrome);
	FIELD(mlx4_err_cqe, reserved2);
	FIELD(mlx4_err_cqe, owner_sr_opcode);
}

static void constants(void)
{
	/* Send opcodes. */
	CONST(MLX4_OPCODE_NOP);
	CONST(MLX4_OPCODE_SEND_INVAL);
	CONST(MLX4_OPCODE_RDMA_WRITE);
	CONST(MLX4_OPCODE_RDMA_WRITE_IMM);
	CONST(MLX4_OPCODE_SEND);
	CONST(MLX4_OPCODE_SEND_IMM);
	CONST(MLX4_OPCODE_LSO);
	CONST(MLX4_OPCODE_RDMA_READ);
	CONST(MLX4_OPCODE_ATOMIC_CS);
	CONST(MLX4_OPCODE_ATOMIC_FA);
	CONST(MLX4_OPCODE_MASKED_ATOMIC_CS);
	CONST(MLX4_OPCODE_MASKED_ATOMIC_FA);
	CONST(MLX4_OPCODE_BIND_MW);
	CONST(MLX4_OPCODE_FMR);
	CONST(MLX4_OPCODE_LOCAL_INVAL);
	CONST(MLX4_OPCODE_CONFIG_CMD);

	/* Receive opcodes. */
	CONST(MLX4_RECV_OPCODE_RDMA_WRITE_IMM);
	CONST(MLX4_RECV_OPCODE_SEND);
	CONST(MLX4_RECV_OPCODE_SEND_IMM);
	CONST(MLX4_RECV_OPCODE_SEND_INVAL);

	/* CQE opcodes and masks. */
	CONST(MLX4_CQE_OPCODE_ERROR);
	CONST(MLX4_CQE_OPCODE_RESIZE);
	CONST(MLX4_CQE_OWNER_MASK);
	CONST(MLX4_CQE_IS_SEND_MASK);
	CONST(MLX4_CQE_OPCODE_MASK);
	CONST(MLX4_CQE_QPN_MASK);

	/* Error syndromes. */
	CONST(MLX4_CQE_SYNDROME_LOCAL_LENGTH_ERR);
	CONST(MLX4_CQE_SYNDROME_LOCAL_QP_OP_ERR);
	CONST(MLX4_CQE_SYNDROME_LOCAL_PROT_ERR);
	CONST(MLX4_CQE_SYNDROME_WR_FLUSH_ERR);
	CONST(MLX4_CQE_SYNDROME_MW_BIND_ERR);
	CONST(MLX4_CQE_SYNDROME_BAD_RESP_ERR);
	CONST(MLX4_CQE_SYNDROME_LOCAL_ACCESS_ERR);
	CONST(MLX4_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
	CONST(MLX4_CQE_SYNDROME_REMOTE_ACCESS_ERR);
	CONST(MLX4_CQE_SYNDROME_REMOTE_OP_ERR);
	CONST(MLX4_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
	CONST(MLX4_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
	CONST(MLX4_CQE_SYNDROME_REMOTE_ABORTED_ERR);

	/* Doorbells. */
	CONST(MLX4_SEND_DOORBELL);
	CONST(MLX4_CQ_DOORBELL);
	CONST(MLX4_CQ_DB_REQ_NOT_SOL);
	CONST(MLX4_CQ_DB_REQ_NOT);

	/* Control-segment flags. */
	CONST(MLX4_WQE_CTRL_SOLICIT);
	CONST(MLX4_WQE_CTRL_CQ_UPDATE);
	CONST(MLX4_WQE_CTRL_IP_HDR_CSUM);
	CONST(MLX4_WQE_CTRL_TCP_UDP_CSUM);
	CONST(MLX4_WQE_CTRL_FENCE);
	CONST(MLX4_WQE_CTRL_STRONG_ORDER);

	/* Bind segment. */
	CONST(MLX4_WQE_BIND_TYPE_2);
	CONST(MLX4_WQE_BIND_ZERO_BASED);
	CONST(MLX4_WQE_MW_REMOTE_READ);
	CONST(MLX4_WQE_MW_REMOTE_WRITE);
	CONST(MLX4_WQE_MW_ATOMIC);

	/* Inline data and scatter lists. */
	CONST(MLX4_INLINE_SEG);
	CONST(MLX4_INLINE_ALIGN);
	CONST(MLX4_INVALID_LKEY);
}

/* The header's inline helpers, on zeroed buffers, with values whose every byte differs. */
static void helpers(void)
{
	struct mlx4_wqe_ctrl_seg ctrl;
	memset(&ctrl, 0, sizeof(ctrl));
	/* SEND_WITH_INV convention: the caller passes imm already big-endian. */
	mlx4dv_set_ctrl_seg(&ctrl, 0x8000000a, 0x43, 0x1234560e, htobe32(0xa1b2c3d4));
	bytes("mlx4dv_set_ctrl_seg", &ctrl, sizeof(ctrl));

	struct mlx4_wqe_data_seg data;
	memset(&data, 0, sizeof(data));
	mlx4dv_set_data_seg(&data, 0x40, 0x2100, (uintptr_t)0x0123456789abcdefULL);
	bytes("mlx4dv_set_data_seg", &data, sizeof(data));

	struct mlx4_wqe_datagram_seg dgram;
	uint8_t dgid[16], mac[6];
	for (int i = 0; i < 16; i++)
		dgid[i] = (uint8_t)(0xf0 + i);
	for (int i = 0; i < 6; i++)
		mac[i] = (uint8_t)(0x60 + i);
	memset(&dgram, 0, sizeof(dgram));
	mlx4dv_set_dgram_seg(&dgram, 0x01abcdef, 0x85, 0x1234, 0x03, 0x07, 0x40, 0x5678abcd,
			     dgid, 0x00c0ffee, 0x80010002, 0x0fed, mac);
	bytes("mlx4dv_set_dgram_seg", &dgram, sizeof(dgram));

	/* CQE accessors on a patterned entry: byte i = 0x11 * i + 3 (byte 31 = 0x12). */
	uint8_t raw[32];
	for (int i = 0; i < 32; i++)
		raw[i] = (uint8_t)(0x11 * i + 3);
	struct mlx4_cqe cqe;
	memcpy(&cqe, raw, sizeof(cqe));
	VALUE("mlx4dv_get_cqe_owner", mlx4dv_get_cqe_owner(&cqe));
	VALUE("mlx4dv_get_cqe_opcode", mlx4dv_get_cqe_opcode(&cqe));
	VALUE("mlx4_cqe.qpn", be32toh(cqe.vlan_my_qpn) & MLX4_CQE_QPN_MASK);
	VALUE("mlx4_cqe.immed_rss_invalid", be32toh(cqe.immed_rss_invalid));
	VALUE("mlx4_cqe.g_mlpath_rqpn", be32toh(cqe.g_mlpath_rqpn));
	VALUE("mlx4_cqe.sl_vid", be16toh(cqe.sl_vid));
	VALUE("mlx4_cqe.rlid", be16toh(cqe.rlid));
	VALUE("mlx4_cqe.byte_cnt", be32toh(cqe.byte_cnt));
	VALUE("mlx4_cqe.wqe_index", be16toh(cqe.wqe_index));
	struct mlx4_err_cqe err;
	memcpy(&err, raw, sizeof(err));
	VALUE("mlx4_err_cqe.wqe_index", be16toh(err.wqe_index));
	VALUE("mlx4_err_cqe.vendor_err", err.vendor_err);
	VALUE("mlx4_err_cqe.syndrome", err.syndrome);
	mlx4dv_set_cqe_owner(&cqe, MLX4_CQE_OWNER_MASK);
	bytes("mlx4dv_set_cqe_owner", &cqe, sizeof(cqe));
	VALUE("mlx4dv_get_cqe_owner(set)", mlx4dv_get_cqe_owner(&cqe));
}

int main(void)
{
	structs();
	constants();
	helpers();
	return 0;
}
