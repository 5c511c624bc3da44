/* Concurrent writers for the MadFS interception library.
 *   writers threads N DIR   N threads: each writes its own file DIR/t<i>,
 *                           and its slice of the shared file DIR/shared
 *                           (pwrite on one descriptor), and appends one
 *                           line per write to DIR/log (O_APPEND, one fd)
 *   writers fork N DIR      the same with N processes forked after the
 *                           shared descriptors were opened
 * Pieces are PIECE bytes, files PIECES pieces long (spanning 1 MiB chunks).
 * Byte j of slice/file i is (i * 31 + j) % 251. Exit status 0 on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PIECE 65536
#define PIECES 24

static const char *dir;
static int shared_fd, log_fd;

static void fill(unsigned char *b, int who, long off, size_t n) {
    for (size_t j = 0; j < n; j++) b[j] = (unsigned char)((who * 31 + off + j) % 251);
}

static int work(int who) {
    char path[4096];
    unsigned char *buf = malloc(PIECE);
    snprintf(path, sizeof path, "%s/t%d", dir, who);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    for (int p = 0; p < PIECES; p++) {
        long off = (long)p * PIECE;
        fill(buf, who, off, PIECE);
        if (write(fd, buf, PIECE) != PIECE) {
            perror("write own");
            return 1;
        }
        long soff = (long)who * PIECES * PIECE + off;
        if (pwrite(shared_fd, buf, PIECE, soff) != PIECE) {
            perror("pwrite shared");
            return 1;
        }
        char line[64];
        int n = snprintf(line, sizeof line, "writer %d piece %d\n", who, p);
        if (write(log_fd, line, n) != n) {
            perror("append log");
            return 1;
        }
    }
    if (close(fd) != 0) {
        perror("close");
        return 1;
    }
    free(buf);
    return 0;
}

static void *thread_main(void *arg) { return (void *)(long)work((int)(long)arg); }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: writers threads|fork N DIR\n");
        return 2;
    }
    int n = atoi(argv[2]);
    dir = argv[3];
    char path[4096];
    snprintf(path, sizeof path, "%s/shared", dir);
    shared_fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    snprintf(path, sizeof path, "%s/log", dir);
    log_fd = open(path, O_CREAT | O_WRONLY | O_APPEND | O_TRUNC, 0644);
    if (shared_fd < 0 || log_fd < 0) {
        perror("open shared");
        return 1;
    }
    int failed = 0;
    if (!strcmp(argv[1], "threads")) {
        pthread_t t[64];
        for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, thread_main, (void *)(long)i);
        for (int i = 0; i < n; i++) {
            void *r;
            pthread_join(t[i], &r);
            failed |= (int)(long)r;
        }
    } else {
        pid_t pids[64];
        for (int i = 0; i < n; i++) {
            pids[i] = fork();
            if (pids[i] == 0) _exit(work(i));
        }
        for (int i = 0; i < n; i++) {
            int st;
            waitpid(pids[i], &st, 0);
            failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
    }
    if (close(shared_fd) != 0 || close(log_fd) != 0) failed = 1;
    printf("%s\n", failed ? "failed" : "done");
    return failed;
}
