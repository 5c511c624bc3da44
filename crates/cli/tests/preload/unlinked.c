/* Files that lose their last name while open (tests/open_unlinked.rs):
 * run on a FUSE mount directly and under `madfs run`, the same program.
 *
 *   unlinked basic  PATH SIZE [MOVED]  open, write SIZE bytes, unlink, then
 *                                      fstat/pread/pwrite/ftruncate/fsync/
 *                                      fchmod through the descriptor, close.
 *                                      With MOVED, the file is made as MOVED
 *                                      and renamed to PATH first (its inode
 *                                      then stays on MOVED's server).
 *   unlinked rename PATH SIZE          open PATH, rename PATH.new over it,
 *                                      read the old bytes through the fd.
 *   unlinked link   PATH SIZE          open PATH, link PATH.2, unlink PATH:
 *                                      one name left, st_nlink 1.
 *   unlinked hold   PATH SIZE          open, write, unlink, print "held",
 *                                      then wait to be killed.
 *
 * Prints "ino N" (the inode) and, at the end, "ok"; any failed check
 * prints what and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("FAIL line %d: ", __LINE__);                              \
            printf(__VA_ARGS__);                                             \
            printf(" (errno %d: %s)\n", errno, strerror(errno));             \
            failures++;                                                      \
        }                                                                    \
    } while (0)

static unsigned char byte_at(long long off, int seed) {
    return (unsigned char)((off * 131 + seed * 7 + (off >> 12)) & 0xff);
}

static void fill(unsigned char *buf, long long off, size_t len, int seed) {
    for (size_t i = 0; i < len; i++)
        buf[i] = byte_at(off + (long long)i, seed);
}

/* Write `size` bytes of pattern `seed` at 0 through `fd`. */
static void write_pattern(int fd, long long size, int seed) {
    size_t step = 1 << 20;
    unsigned char *buf = malloc(step);
    for (long long off = 0; off < size; off += step) {
        size_t n = size - off < (long long)step ? (size_t)(size - off) : step;
        fill(buf, off, n, seed);
        ssize_t w = pwrite(fd, buf, n, off);
        CHECK(w == (ssize_t)n, "pwrite %zu at %lld: %zd", n, off, w);
    }
    free(buf);
}

/* Read [0, size) through `fd`; whether it is pattern `seed`. */
static int read_matches(int fd, long long size, int seed) {
    size_t step = 1 << 20;
    unsigned char *buf = malloc(step), *want = malloc(step);
    int ok = 1;
    for (long long off = 0; off < size && ok; off += step) {
        size_t n = size - off < (long long)step ? (size_t)(size - off) : step;
        ssize_t r = pread(fd, buf, n, off);
        fill(want, off, n, seed);
        if (r != (ssize_t)n || memcmp(buf, want, n) != 0) {
            printf("read at %lld: got %zd of %zu bytes%s\n", off, r, n,
                   r == (ssize_t)n ? ", not the pattern" : "");
            ok = 0;
        }
    }
    free(buf);
    free(want);
    return ok;
}

static int open_new(const char *path, long long size, int seed) {
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0, "open %s", path);
    if (fd >= 0)
        write_pattern(fd, size, seed);
    return fd;
}

static void basic(const char *path, long long size, const char *moved) {
    int fd;
    if (moved) {
        fd = open_new(moved, size, 1);
        CHECK(rename(moved, path) == 0, "rename %s %s", moved, path);
    } else {
        fd = open_new(path, size, 1);
    }
    if (fd < 0)
        return;
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    printf("ino %llu\n", (unsigned long long)st.st_ino);
    CHECK(unlink(path) == 0, "unlink");
    CHECK(stat(path, &st) < 0 && errno == ENOENT, "stat after unlink");
    CHECK(fstat(fd, &st) == 0, "fstat after unlink");
    CHECK(st.st_nlink == 0, "st_nlink %lu after unlink", (unsigned long)st.st_nlink);
    CHECK(st.st_size == size, "size %lld, want %lld", (long long)st.st_size, size);
    CHECK(read_matches(fd, size, 1), "read back after unlink");
    /* Writes after the unlink: grow by a block past the old end. */
    unsigned char tail[4096];
    fill(tail, size, sizeof tail, 1);
    CHECK(pwrite(fd, tail, sizeof tail, size) == (ssize_t)sizeof tail, "pwrite after unlink");
    CHECK(fsync(fd) == 0, "fsync");
    CHECK(fstat(fd, &st) == 0 && st.st_size == size + (long long)sizeof tail,
          "size after the write: %lld", (long long)st.st_size);
    CHECK(read_matches(fd, size + sizeof tail, 1), "read back the write");
    CHECK(ftruncate(fd, size / 2) == 0, "ftruncate");
    CHECK(fstat(fd, &st) == 0 && st.st_size == size / 2, "size after ftruncate: %lld",
          (long long)st.st_size);
    CHECK(read_matches(fd, size / 2, 1), "read after ftruncate");
    CHECK(fchmod(fd, 0600) == 0, "fchmod");
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0600, "mode %o",
          st.st_mode & 07777);
    CHECK(st.st_nlink == 0, "st_nlink %lu at the end", (unsigned long)st.st_nlink);
    CHECK(close(fd) == 0, "close");
}

static void over(const char *path, long long size) {
    char newer[4096];
    snprintf(newer, sizeof newer, "%s.new", path);
    int fd = open_new(path, size, 1);
    int fd2 = open_new(newer, 100, 2);
    if (fd < 0 || fd2 < 0)
        return;
    close(fd2);
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    printf("ino %llu\n", (unsigned long long)st.st_ino);
    CHECK(rename(newer, path) == 0, "rename over the open file");
    CHECK(fstat(fd, &st) == 0 && st.st_nlink == 0, "st_nlink after rename: %lu",
          (unsigned long)st.st_nlink);
    CHECK(read_matches(fd, size, 1), "old bytes through the fd");
    CHECK(pwrite(fd, "x", 1, 0) == 1, "pwrite after rename");
    CHECK(stat(path, &st) == 0 && st.st_size == 100, "the new file: size %lld",
          (long long)st.st_size);
    CHECK(close(fd) == 0, "close");
    CHECK(unlink(path) == 0, "unlink the new file");
}

static void linked(const char *path, long long size) {
    char other[4096];
    snprintf(other, sizeof other, "%s.2", path);
    int fd = open_new(path, size, 1);
    if (fd < 0)
        return;
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    printf("ino %llu\n", (unsigned long long)st.st_ino);
    CHECK(link(path, other) == 0, "link");
    CHECK(unlink(path) == 0, "unlink");
    CHECK(fstat(fd, &st) == 0 && st.st_nlink == 1, "st_nlink %lu",
          (unsigned long)st.st_nlink);
    CHECK(close(fd) == 0, "close");
    fd = open(other, O_RDONLY);
    CHECK(fd >= 0, "open the other name");
    if (fd >= 0) {
        CHECK(read_matches(fd, size, 1), "the other name's bytes");
        close(fd);
    }
}

static void hold(const char *path, long long size) {
    int fd = open_new(path, size, 1);
    if (fd < 0)
        return;
    struct stat st;
    CHECK(fstat(fd, &st) == 0, "fstat");
    printf("ino %llu\n", (unsigned long long)st.st_ino);
    CHECK(unlink(path) == 0, "unlink");
    CHECK(read_matches(fd, size, 1), "read after unlink");
    printf("held\n");
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: unlinked basic|rename|link|hold PATH SIZE [MOVED]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argv[1], *path = argv[2];
    long long size = atoll(argv[3]);
    if (strcmp(mode, "basic") == 0)
        basic(path, size, argc > 4 ? argv[4] : NULL);
    else if (strcmp(mode, "rename") == 0)
        over(path, size);
    else if (strcmp(mode, "link") == 0)
        linked(path, size);
    else if (strcmp(mode, "hold") == 0)
        hold(path, size);
    else
        return 2;
    if (failures)
        return 1;
    printf("ok\n");
    return 0;
}
