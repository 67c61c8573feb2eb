/*
 * hccl_sim.h: the subset of CANN's HCCL C API that the CPU simulator exports.
 *
 * Types, enum values and the root-info size follow CANN's hccl_types.h / hccl.h, so the
 * same ctypes binding (vllm_npu/distributed/hccl_library.py) drives either the real
 * libhccl.so or libhccl_sim.so.  Everything here is synchronous: the `stream` argument
 * of the collectives is accepted and ignored.
 */
#ifndef VLLM_NPU_HCCL_SIM_H_
#define VLLM_NPU_HCCL_SIM_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HCCL_SUCCESS = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_MEMORY = 3,
    HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5,
    HCCL_E_NOT_FOUND = 6,
    HCCL_E_UNAVAIL = 7,
    HCCL_E_SYSCALL = 8,
    HCCL_E_TIMEOUT = 9,
    HCCL_E_OPEN_FILE_FAILURE = 10,
    HCCL_E_TCP_CONNECT = 11,
    HCCL_E_ROCE_CONNECT = 12,
    HCCL_E_TCP_TRANSFER = 13,
    HCCL_E_ROCE_TRANSFER = 14,
    HCCL_E_RUNTIME = 15,
    HCCL_E_DRV = 16,
    HCCL_E_PROFILING = 17,
    HCCL_E_CCE = 18,
    HCCL_E_NETWORK = 19,
    HCCL_E_AGAIN = 20,
    HCCL_E_REMOTE = 21,
    HCCL_E_SUSPENDING = 22,
    HCCL_E_RESERVED
} HcclResult;

typedef enum {
    HCCL_REDUCE_SUM = 0,
    HCCL_REDUCE_PROD = 1,
    HCCL_REDUCE_MAX = 2,
    HCCL_REDUCE_MIN = 3,
    HCCL_REDUCE_RESERVED
} HcclReduceOp;

typedef enum {
    HCCL_DATA_TYPE_INT8 = 0,
    HCCL_DATA_TYPE_INT16 = 1,
    HCCL_DATA_TYPE_INT32 = 2,
    HCCL_DATA_TYPE_FP16 = 3,
    HCCL_DATA_TYPE_FP32 = 4,
    HCCL_DATA_TYPE_INT64 = 5,
    HCCL_DATA_TYPE_UINT64 = 6,
    HCCL_DATA_TYPE_UINT8 = 7,
    HCCL_DATA_TYPE_UINT16 = 8,
    HCCL_DATA_TYPE_UINT32 = 9,
    HCCL_DATA_TYPE_FP64 = 10,
    HCCL_DATA_TYPE_BFP16 = 11,
    HCCL_DATA_TYPE_INT128 = 12,
    HCCL_DATA_TYPE_RESERVED
} HcclDataType;

#define HCCL_ROOT_INFO_BYTES 4108

typedef struct HcclRootInfoDef {
    char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

typedef void *HcclComm;
typedef void *aclrtStream;

#define HCCL_SIM_API __attribute__((visibility("default")))

HCCL_SIM_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HCCL_SIM_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                             uint32_t rank, HcclComm *comm);
HCCL_SIM_API HcclResult HcclCommDestroy(HcclComm comm);
HCCL_SIM_API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
HCCL_SIM_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);

HCCL_SIM_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count,
                                      HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                      aclrtStream stream);
HCCL_SIM_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType,
                                      uint32_t root, HcclComm comm, aclrtStream stream);
HCCL_SIM_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
                                      HcclDataType dataType, HcclComm comm, aclrtStream stream);
HCCL_SIM_API HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                          HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                          aclrtStream stream);
HCCL_SIM_API HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType,
                                 uint32_t destRank, HcclComm comm, aclrtStream stream);
HCCL_SIM_API HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType,
                                 uint32_t srcRank, HcclComm comm, aclrtStream stream);
HCCL_SIM_API HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType,
                                     const void *recvBuf, uint64_t recvCount, HcclDataType recvType,
                                     HcclComm comm, aclrtStream stream);
/* sendCounts, sdispls, recvCounts, rdispls: host arrays of nRanks uint64_t (elements). */
HCCL_SIM_API HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts,
                                      const void *sdispls, HcclDataType sendType,
                                      const void *recvBuf, const void *recvCounts,
                                      const void *rdispls, HcclDataType recvType,
                                      HcclComm comm, aclrtStream stream);
HCCL_SIM_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
HCCL_SIM_API const char *HcclGetErrorString(HcclResult code);

/* Simulator only: the detail of the last failure in the calling thread ("" if none). */
HCCL_SIM_API const char *HcclSimGetLastError(void);

#ifdef __cplusplus
}
#endif
#endif /* VLLM_NPU_HCCL_SIM_H_ */
