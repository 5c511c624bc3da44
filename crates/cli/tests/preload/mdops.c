/* mdtest's per-file operations, one phase per run, as mdtest's ranks do
 * them (run under `madfs run --stats` to count the requests each costs):
 *   mdops create N DIR        open(O_CREAT|O_WRONLY) and close N empty files
 *   mdops write N DIR SIZE    the same, writing SIZE bytes before the close
 *   mdops stat N DIR          stat each file (expects SIZE 0 unless given)
 *   mdops read N DIR SIZE     open, read SIZE bytes (checked), close; opened
 *                             O_RDWR, as IOR's POSIX backend opens what mdtest
 *                             reads (it maps mdtest's O_RDONLY to O_RDWR)
 *   mdops unlink N DIR
 * Files are DIR/f0 .. DIR/f<N-1>. DIR is stat()ed once first, so its own
 * lookups are paid before the loop (as mdtest's earlier phases pay them).
 * Exits 1 with the failing call on stderr. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what, const char *path) {
    perror(path);
    fprintf(stderr, "mdops: %s failed\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: mdops create|write|stat|read|unlink N DIR [SIZE]\n");
        return 2;
    }
    const char *op = argv[1];
    int n = atoi(argv[2]);
    const char *dir = argv[3];
    size_t size = argc > 4 ? (size_t)atol(argv[4]) : 0;
    char *buf = malloc(size + 1);
    for (size_t i = 0; i < size; i++)
        buf[i] = (char)('a' + i % 26);
    char *got = malloc(size + 1);
    struct stat st;
    if (stat(dir, &st) != 0)
        return fail("stat of the directory", dir);
    char p[4096];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        if (!strcmp(op, "create") || !strcmp(op, "write")) {
            int fd = open(p, O_CREAT | O_WRONLY, 0644);
            if (fd < 0)
                return fail("open(O_CREAT)", p);
            if (size > 0 && write(fd, buf, size) != (ssize_t)size)
                return fail("write", p);
            if (close(fd) != 0)
                return fail("close", p);
        } else if (!strcmp(op, "stat")) {
            if (stat(p, &st) != 0)
                return fail("stat", p);
            if ((size_t)st.st_size != size) {
                fprintf(stderr, "mdops: %s has %ld bytes, not %zu\n", p, (long)st.st_size, size);
                return 1;
            }
        } else if (!strcmp(op, "read")) {
            int fd = open(p, O_RDWR);
            if (fd < 0)
                return fail("open", p);
            ssize_t r = read(fd, got, size + 1);
            if (r != (ssize_t)size || memcmp(got, buf, size) != 0) {
                fprintf(stderr, "mdops: read %zd bytes of %s, wanted %zu\n", r, p, size);
                return 1;
            }
            if (close(fd) != 0)
                return fail("close", p);
        } else if (!strcmp(op, "unlink")) {
            if (unlink(p) != 0)
                return fail("unlink", p);
        } else {
            fprintf(stderr, "mdops: unknown operation %s\n", op);
            return 2;
        }
    }
    return 0;
}
