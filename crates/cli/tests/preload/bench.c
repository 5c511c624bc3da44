/* Figures for the interception library (run under `madfs run`):
 *   bench create N DIR     create and close N empty files; files/s
 *   bench write MIB PATH   write MIB MiB in 1 MiB writes, fsync, close; MiB/s
 *   bench read PATH        read a file in 1 MiB reads; MiB/s
 * Prints one line: "<what> <value>". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 3 && !strcmp(argv[1], "read"))) {
        fprintf(stderr, "usage: bench create N DIR | write MIB PATH | read PATH\n");
        return 2;
    }
    if (!strcmp(argv[1], "create")) {
        int n = atoi(argv[2]);
        char p[4096];
        double t0 = now();
        for (int i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/f%d", argv[3], i);
            int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0644);
            if (fd < 0 || close(fd) != 0) {
                perror(p);
                return 1;
            }
        }
        printf("create_per_s %.0f\n", n / (now() - t0));
    } else if (!strcmp(argv[1], "write")) {
        int mib = atoi(argv[2]);
        char *buf = malloc(1 << 20);
        memset(buf, 'w', 1 << 20);
        double t0 = now();
        int fd = open(argv[3], O_CREAT | O_TRUNC | O_WRONLY, 0644);
        for (int i = 0; i < mib; i++)
            if (write(fd, buf, 1 << 20) != 1 << 20) {
                perror("write");
                return 1;
            }
        if (fsync(fd) != 0 || close(fd) != 0) {
            perror("fsync/close");
            return 1;
        }
        printf("write_mib_per_s %.1f\n", mib / (now() - t0));
    } else {
        char *buf = malloc(1 << 20);
        double t0 = now();
        int fd = open(argv[2], O_RDONLY);
        long total = 0;
        ssize_t k;
        while ((k = read(fd, buf, 1 << 20)) > 0) total += k;
        close(fd);
        printf("read_mib_per_s %.1f\n", total / 1048576.0 / (now() - t0));
    }
    return 0;
}
