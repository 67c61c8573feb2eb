/* Which "host" a simulated HCCL rank is on, and whether it can reach the root rank.
 *
 * On a device, HcclCommInitRootInfo's ranks connect over TCP to the address the root rank's
 * HcclGetRootInfo put in the root info: the host NIC chosen by HCCL_IF_IP, else
 * HCCL_SOCKET_IFNAME (CANN "Environment Variables": HCCL_IF_IP, HCCL_SOCKET_IFNAME,
 * HCCL_HOST_SOCKET_PORT_RANGE). A rank that cannot reach it fails the init
 * (HCCL_E_TCP_CONNECT). The simulator moves data through one machine's shared memory, which
 * also spans network namespaces; tests use namespaces as hosts. So:
 *   - the root listens on its HCCL address (HCCL_IF_IP; else the first IPv4 address of
 *     HCCL_SOCKET_IFNAME; else of the first up interface by name that is neither loopback nor
 *     docker*; else 127.0.0.1), on a port the OS picks (HCCL_HOST_SOCKET_PORT_RANGE=auto),
 *     and writes address, port, its network namespace and the machine's boot id into the
 *     root info;
 *   - a rank in another network namespace (another host) connects to that address first and
 *     fails with HCCL_E_TCP_CONNECT when it cannot;
 *   - a rank on another machine (boot id) fails with HCCL_E_NOT_SUPPORT: no transport spans
 *     machines here.
 * The listening socket closes once the root rank's communicator is complete. */
#define _GNU_SOURCE
#include "hccl_sim_hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_LISTENERS 64

static struct {
    char name[SIM_HOST_NAME_MAX];
    int fd;
} g_listeners[MAX_LISTENERS];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t netns_id(void)
{
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void boot_id(char out[SIM_HOST_BOOT_ID])
{
    memset(out, 0, SIM_HOST_BOOT_ID);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f == NULL)
        return;
    if (fgets(out, SIM_HOST_BOOT_ID, f) != NULL)
        out[strcspn(out, "\n")] = '\0';
    fclose(f);
}

static int usable(const struct ifaddrs *a)
{
    return a->ifa_addr != NULL && a->ifa_addr->sa_family == AF_INET &&
           (a->ifa_flags & IFF_UP) && !(a->ifa_flags & IFF_LOOPBACK);
}

/* The root's HCCL address (see the file comment); "" when HCCL_IF_IP is not an IPv4
 * address or HCCL_SOCKET_IFNAME names no IPv4 interface (the caller says so). */
static void hccl_address(char out[INET_ADDRSTRLEN], const char **source)
{
    struct in_addr probe;
    const char *ip = getenv("HCCL_IF_IP");
    out[0] = '\0';
    if (ip != NULL && *ip) {
        *source = "HCCL_IF_IP";
        if (inet_pton(AF_INET, ip, &probe) == 1)
            snprintf(out, INET_ADDRSTRLEN, "%s", ip);
        return;
    }
    const char *ifname = getenv("HCCL_SOCKET_IFNAME");
    struct ifaddrs *list = NULL, *best = NULL;
    if (getifaddrs(&list) != 0)
        list = NULL;
    if (ifname != NULL && *ifname) {
        *source = "HCCL_SOCKET_IFNAME";
        for (struct ifaddrs *a = list; a; a = a->ifa_next)
            if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET &&
                strcmp(a->ifa_name, ifname) == 0) {
                best = a;
                break;
            }
    } else {
        *source = "the first network interface";
        for (struct ifaddrs *a = list; a; a = a->ifa_next)
            if (usable(a) && strncmp(a->ifa_name, "docker", 6) != 0 &&
                (best == NULL || strcmp(a->ifa_name, best->ifa_name) < 0))
                best = a;
        if (best == NULL)
            snprintf(out, INET_ADDRSTRLEN, "127.0.0.1");
    }
    if (best != NULL)
        inet_ntop(AF_INET, &((struct sockaddr_in *)best->ifa_addr)->sin_addr, out,
                  INET_ADDRSTRLEN);
    if (list != NULL)
        freeifaddrs(list);
}

static void remember(const char *name, int fd)
{
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < MAX_LISTENERS && slot < 0; i++)
        if (g_listeners[i].name[0] == '\0')
            slot = i;
    if (slot < 0) { /* root infos never used by an init: recycle the oldest slot */
        slot = 0;
        close(g_listeners[0].fd);
    }
    snprintf(g_listeners[slot].name, SIM_HOST_NAME_MAX, "%s", name);
    g_listeners[slot].fd = fd;
    pthread_mutex_unlock(&g_lock);
}

int sim_host_listen(sim_host_t *host, const char *name, char *err, size_t err_len)
{
    const char *source = "";
    memset(host, 0, sizeof(*host));
    host->netns = netns_id();
    boot_id(host->boot_id);
    hccl_address(host->addr, &source);
    if (host->addr[0] == '\0') {
        snprintf(err, err_len, "%s gives no IPv4 address to listen on", source);
        return -1;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, host->addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(fd, 128) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        snprintf(err, err_len, "cannot listen on %s (%s): %s", host->addr, source,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    host->port = ntohs(sa.sin_port);
    remember(name, fd);
    return 0;
}

void sim_host_release(const char *name)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_LISTENERS; i++)
        if (g_listeners[i].name[0] && strcmp(g_listeners[i].name, name) == 0) {
            close(g_listeners[i].fd);
            g_listeners[i].name[0] = '\0';
        }
    pthread_mutex_unlock(&g_lock);
}

static int connect_within(const char *addr, uint16_t port, int timeout_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return errno;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = rc == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        rc = poll(&p, 1, timeout_ms);
        socklen_t elen = sizeof(e);
        if (rc == 0)
            e = ETIMEDOUT;
        else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
            e = errno;
    }
    close(fd);
    return e;
}

HcclResult sim_host_check(const sim_host_t *root, uint32_t rank, double timeout_s, char *err,
                          size_t err_len)
{
    char mine[SIM_HOST_BOOT_ID];
    boot_id(mine);
    if (root->boot_id[0] && mine[0] && strcmp(root->boot_id, mine) != 0) {
        snprintf(err, err_len, "rank %u runs on another machine than the root rank (boot id "
                 "%s vs %s): the simulated HCCL moves data through one machine's shared "
                 "memory", rank, mine, root->boot_id);
        return HCCL_E_NOT_SUPPORT;
    }
    if (root->netns == netns_id())
        return HCCL_SUCCESS;
    int ms = timeout_s < 10.0 ? (int)(timeout_s * 1000) : 10000;
    int e = connect_within(root->addr, root->port, ms);
    if (e != 0) {
        snprintf(err, err_len, "rank %u is on another host (network namespace) than the root "
                 "rank and cannot reach its HCCL address %s:%u: %s (set HCCL_IF_IP on the "
                 "root's host to an address every rank reaches)", rank, root->addr,
                 (unsigned)root->port, strerror(e));
        return HCCL_E_TCP_CONNECT;
    }
    return HCCL_SUCCESS;
}
