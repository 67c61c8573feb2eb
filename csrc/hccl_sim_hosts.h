/* Hosts of simulated HCCL ranks and reachability of the root rank (hccl_sim_hosts.c). */
#ifndef HCCL_SIM_HOSTS_H
#define HCCL_SIM_HOSTS_H

#include <stddef.h>
#include <stdint.h>

#include "hccl_sim.h"

#define SIM_HOST_BOOT_ID 40
#define SIM_HOST_NAME_MAX 64

/* What the root info carries about the root rank's host. */
typedef struct {
    uint64_t netns;                 /* network namespace: a host, for the simulator */
    char boot_id[SIM_HOST_BOOT_ID]; /* the machine */
    char addr[16];                  /* the root's HCCL address (IPv4, dotted) */
    uint16_t port;                  /* where the root listens */
    uint16_t reserved[3];
} sim_host_t;

/* Root side, in HcclGetRootInfo: fill `host` and listen on its address until
 * sim_host_release(name). -1 with `err` set when there is no address to listen on. */
int sim_host_listen(sim_host_t *host, const char *name, char *err, size_t err_len);
void sim_host_release(const char *name);

/* Rank side, in HcclCommInitRootInfo: HCCL_SUCCESS when the rank shares the root's host or
 * reaches its address; otherwise the HCCL error with `err` set. */
HcclResult sim_host_check(const sim_host_t *root, uint32_t rank, double timeout_s, char *err,
                          size_t err_len);

#endif
