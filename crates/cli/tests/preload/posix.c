/* Exercises the calls the MadFS interception library serves, with their
 * error cases. Run under `madfs run`: posix BASE LOCAL, where BASE is a
 * fresh directory path under the prefix (created here) and LOCAL a kernel
 * directory. Prints "ok SECTION" per section; every failed check prints a
 * FAIL line on stderr; the exit status is the number of failures. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <grp.h>
#include <sys/xattr.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            int e_ = errno;                                                   \
            failures++;                                                       \
            fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, " (errno %d: %s)\n", e_, strerror(e_));           \
        }                                                                     \
    } while (0)

/* expr must fail with errno e. */
#define FAILS(expr, e)                                                        \
    do {                                                                      \
        errno = 0;                                                            \
        long r_ = (long)(expr);                                               \
        CHECK(r_ == -1 && errno == (e), "%s: want -1/%s, got %ld", #expr,     \
              strerror(e), r_);                                               \
    } while (0)

#define OK(expr) CHECK((long)(expr) >= 0, "%s", #expr)

static char base[PATH_MAX], local[PATH_MAX];

static const char *P(const char *rel) {
    static char bufs[8][PATH_MAX];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", base, rel);
    return b;
}

static const char *L(const char *rel) {
    static char bufs[4][PATH_MAX];
    static int i;
    char *b = bufs[i++ % 4];
    snprintf(b, PATH_MAX, "%s/%s", local, rel);
    return b;
}

static void section(const char *name) { printf("ok %s\n", name); fflush(stdout); }

static void files(void) {
    char buf[256];
    int fd = open(P("f"), O_CREAT | O_EXCL | O_RDWR, 0640);
    OK(fd);
    FAILS(open(P("f"), O_CREAT | O_EXCL | O_RDWR, 0640), EEXIST);
    CHECK(write(fd, "hello world", 11) == 11, "write");
    CHECK(lseek(fd, 0, SEEK_CUR) == 11, "offset after write");
    CHECK(lseek(fd, 0, SEEK_SET) == 0, "lseek set");
    memset(buf, 0, sizeof buf);
    CHECK(read(fd, buf, sizeof buf) == 11 && !memcmp(buf, "hello world", 11), "read back");
    CHECK(read(fd, buf, sizeof buf) == 0, "read at eof");
    CHECK(pwrite(fd, "W", 1, 6) == 1, "pwrite");
    CHECK(pwrite64(fd, "!", 1, 11) == 1, "pwrite64");
    CHECK(lseek(fd, 0, SEEK_CUR) == 11, "pwrite keeps the offset");
    CHECK(pread(fd, buf, 12, 0) == 12 && !memcmp(buf, "hello World!", 12), "pread");
    CHECK(pread64(fd, buf, 5, 6) == 5 && !memcmp(buf, "World", 5), "pread64");
    CHECK(lseek64(fd, -2, SEEK_END) == 10, "lseek64 end");
    FAILS(lseek(fd, -100, SEEK_CUR), EINVAL);
    CHECK(lseek(fd, 3, SEEK_DATA) == 3, "SEEK_DATA");
    CHECK(lseek(fd, 3, SEEK_HOLE) == 12, "SEEK_HOLE");
    FAILS(lseek(fd, 50, SEEK_DATA), ENXIO);
    /* Vectored I/O. */
    struct iovec wv[3] = {{"ab", 2}, {"", 0}, {"cdef", 4}};
    CHECK(lseek(fd, 0, SEEK_END) == 12, "to end");
    CHECK(writev(fd, wv, 3) == 6, "writev");
    char a[3] = {0}, b[5] = {0};
    struct iovec rv[2] = {{a, 2}, {b, 4}};
    CHECK(preadv(fd, rv, 2, 12) == 6 && !memcmp(a, "ab", 2) && !memcmp(b, "cdef", 4), "preadv");
    struct iovec pw[1] = {{"ZZ", 2}};
    CHECK(pwritev(fd, pw, 1, 0) == 2, "pwritev");
    CHECK(lseek(fd, 0, SEEK_SET) == 0, "rewind");
    memset(a, 0, 3);
    memset(b, 0, 5);
    CHECK(readv(fd, rv, 2) == 6 && !memcmp(a, "ZZ", 2) && !memcmp(b, "llo ", 4), "readv");
    /* fstat and friends. */
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(st.st_size == 18 && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0640,
          "fstat size %ld mode %o", (long)st.st_size, st.st_mode);
    struct stat st2;
    OK(stat(P("f"), &st2));
    CHECK(st2.st_ino == st.st_ino && st2.st_dev == st.st_dev, "stat = fstat");
    OK(fsync(fd));
    OK(fdatasync(fd));
    OK(ftruncate(fd, 5));
    OK(fstat(fd, &st));
    CHECK(st.st_size == 5, "ftruncate");
    OK(close(fd));
    FAILS(close(fd), EBADF);
    FAILS(read(fd, buf, 1), EBADF);
    OK(truncate(P("f"), 3));
    OK(stat(P("f"), &st));
    CHECK(st.st_size == 3, "truncate");
    FAILS(truncate(P("missing"), 0), ENOENT);

    /* Access modes. */
    fd = open(P("f"), O_RDONLY);
    OK(fd);
    FAILS(write(fd, "x", 1), EBADF);
    FAILS(ftruncate(fd, 0), EINVAL);
    close(fd);
    fd = open(P("f"), O_WRONLY | O_APPEND);
    OK(fd);
    FAILS(read(fd, buf, 1), EBADF);
    CHECK(write(fd, "++", 2) == 2, "append");
    CHECK(lseek(fd, 0, SEEK_CUR) == 5, "append offset");
    close(fd);
    fd = creat(P("f"), 0600);
    OK(fd);
    OK(fstat(fd, &st));
    CHECK(st.st_size == 0, "creat truncates");
    close(fd);
    fd = open64(P("g"), O_CREAT | O_WRONLY | O_TRUNC, 0666);
    OK(fd);
    close(fd);
    FAILS(open(P("missing"), O_RDONLY), ENOENT);
    FAILS(open(P("f/x"), O_RDONLY), ENOTDIR);
    FAILS(open(P("f/"), O_RDONLY), ENOTDIR);
    FAILS(open(base, O_WRONLY), EISDIR);
    FAILS(open(P("f"), O_RDONLY | O_DIRECTORY), ENOTDIR);
    section("files");
}

static void large(void) {
    /* 3 MiB + a bit: spans chunks (1 MiB in tests), written in odd pieces. */
    size_t n = 3 * 1024 * 1024 + 4097;
    unsigned char *w = malloc(n), *r = malloc(n);
    for (size_t i = 0; i < n; i++) w[i] = (unsigned char)(i * 7 + (i >> 13));
    int fd = open(P("large"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    OK(fd);
    size_t off = 0, step = 100000;
    while (off < n) {
        size_t k = n - off < step ? n - off : step;
        CHECK(write(fd, w + off, k) == (ssize_t)k, "large write");
        off += k;
    }
    OK(close(fd));
    struct stat st;
    OK(stat(P("large"), &st));
    CHECK(st.st_size == (off_t)n, "large size %ld", (long)st.st_size);
    fd = open(P("large"), O_RDONLY);
    size_t got = 0;
    ssize_t k;
    while ((k = read(fd, r + got, 65536)) > 0) got += k;
    CHECK(got == n && !memcmp(w, r, n), "large read back (%zu)", got);
    /* mmap gives a private copy. */
    void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED && !memcmp(m, w, n), "mmap");
    if (m != MAP_FAILED) munmap(m, n);
    errno = 0;
    CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED &&
          (errno == ENOTSUP || errno == EACCES), "shared writable mmap refused");
    close(fd);
    free(w);
    free(r);
    section("large");
}

static void meta(void) {
    struct stat st;
    OK(mkdir(P("d"), 0750));
    FAILS(mkdir(P("d"), 0750), EEXIST);
    FAILS(mkdir(P("no/such"), 0750), ENOENT);
    OK(stat(P("d"), &st));
    CHECK(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == (0750 & ~022), "mkdir mode %o", st.st_mode);
    int dfd = open(P("d"), O_RDONLY | O_DIRECTORY);
    OK(dfd);
    OK(mkdirat(dfd, "sub", 0755));
    int fd = openat(dfd, "sub/inner", O_CREAT | O_WRONLY, 0644);
    OK(fd);
    CHECK(write(fd, "inner", 5) == 5, "write inner");
    close(fd);
    fd = openat64(dfd, "../f", O_RDONLY);
    OK(fd);
    close(fd);
    OK(fstatat(dfd, "sub/inner", &st, 0));
    CHECK(st.st_size == 5, "fstatat");
    OK(fstatat(dfd, "", &st, AT_EMPTY_PATH));
    CHECK(S_ISDIR(st.st_mode), "fstatat AT_EMPTY_PATH");
    struct statx sx;
    OK(statx(dfd, "sub/inner", 0, STATX_BASIC_STATS, &sx));
    CHECK(sx.stx_size == 5 && S_ISREG(sx.stx_mode), "statx");
    OK(statx(AT_FDCWD, P("d"), AT_SYMLINK_NOFOLLOW, STATX_ALL, &sx));
    CHECK(S_ISDIR(sx.stx_mode), "statx dir");
    /* Old glibc entry points, looked up as an old binary would bind them. */
    int (*xstat)(int, const char *, struct stat *) = (int (*)(int, const char *, struct stat *))dlsym(RTLD_DEFAULT, "__xstat");
    if (xstat) {
        OK(xstat(1, P("d/sub/inner"), &st));
        CHECK(st.st_size == 5, "__xstat");
    }
    /* access */
    OK(access(P("f"), F_OK));
    OK(access(P("f"), R_OK | W_OK));
    FAILS(access(P("missing"), F_OK), ENOENT);
    OK(faccessat(dfd, "sub", X_OK, 0));
    FAILS(access(P("f"), 0x40), EINVAL);
    /* rmdir/unlink errors */
    FAILS(rmdir(P("d")), ENOTEMPTY);
    FAILS(unlink(P("d")), EISDIR);
    FAILS(rmdir(P("f")), ENOTDIR);
    FAILS(unlinkat(dfd, "sub", 0), EISDIR);
    OK(unlinkat(dfd, "sub/inner", 0));
    OK(unlinkat(dfd, "sub", AT_REMOVEDIR));
    FAILS(unlink(P("d/sub")), ENOENT);
    close(dfd);
    /* rename */
    OK(rename(P("g"), P("g2")));
    FAILS(stat(P("g"), &st), ENOENT);
    OK(renameat(AT_FDCWD, P("g2"), AT_FDCWD, P("d/g3")));
    int fd2 = open(P("h"), O_CREAT | O_WRONLY, 0644);
    close(fd2);
    FAILS(renameat2(AT_FDCWD, P("h"), AT_FDCWD, P("d/g3"), RENAME_NOREPLACE), EEXIST);
    OK(renameat2(AT_FDCWD, P("h"), AT_FDCWD, P("d/g3"), 0));
    FAILS(rename(P("d"), P("d/inside")), EINVAL);
    FAILS(rename(P("d/g3"), L("x")), EXDEV);
    /* links */
    OK(link(P("f"), P("f-hard")));
    OK(stat(P("f"), &st));
    CHECK(st.st_nlink == 2, "nlink %ld", (long)st.st_nlink);
    FAILS(link(P("d"), P("d-hard")), EPERM);
    OK(linkat(AT_FDCWD, P("f"), AT_FDCWD, P("f-hard2"), 0));
    OK(symlink("f", P("sym")));
    OK(symlinkat("d/g3", AT_FDCWD, P("sym2")));
    char t[64] = {0};
    CHECK(readlink(P("sym"), t, sizeof t) == 1 && t[0] == 'f', "readlink");
    CHECK(readlinkat(AT_FDCWD, P("sym2"), t, sizeof t) == 4 && !memcmp(t, "d/g3", 4), "readlinkat");
    FAILS(readlink(P("f"), t, sizeof t), EINVAL);
    OK(lstat(P("sym"), &st));
    CHECK(S_ISLNK(st.st_mode), "lstat symlink");
    OK(stat(P("sym"), &st));
    CHECK(S_ISREG(st.st_mode), "stat follows");
    FAILS(open(P("sym"), O_RDONLY | O_NOFOLLOW), ELOOP);
    fd = open(P("sym"), O_RDONLY);
    OK(fd);
    close(fd);
    FAILS(symlink("x", P("sym")), EEXIST);
    /* permissions, owners, times */
    OK(chmod(P("f"), 0604));
    OK(stat(P("f"), &st));
    CHECK((st.st_mode & 07777) == 0604, "chmod %o", st.st_mode);
    fd = open(P("f"), O_RDONLY);
    OK(fchmod(fd, 0644));
    OK(fchown(fd, getuid(), getgid()));
    struct timespec ts[2] = {{1000000000, 5}, {1200000000, 7}};
    OK(futimens(fd, ts));
    OK(fstat(fd, &st));
    CHECK(st.st_atim.tv_sec == 1000000000 && st.st_mtim.tv_sec == 1200000000 &&
          st.st_mtim.tv_nsec == 7, "futimens");
    close(fd);
    OK(fchmodat(AT_FDCWD, P("f"), 0600, 0));
    OK(chown(P("f"), getuid(), getgid()));
    OK(lchown(P("sym"), getuid(), getgid()));
    OK(fchownat(AT_FDCWD, P("f"), -1, getgid(), 0));
    struct timespec ts2[2] = {{0, UTIME_OMIT}, {1300000000, 0}};
    OK(utimensat(AT_FDCWD, P("f"), ts2, 0));
    OK(stat(P("f"), &st));
    CHECK(st.st_mtim.tv_sec == 1300000000 && st.st_atim.tv_sec == 1000000000 &&
          (st.st_mode & 07777) == 0600, "utimensat");
    OK(utimensat(AT_FDCWD, P("f"), NULL, 0));
    OK(stat(P("f"), &st));
    CHECK(st.st_mtim.tv_sec > 1300000000, "utimensat now");
    if (getuid() == 0) {
        OK(chown(P("f"), 4242, 4343));
        OK(stat(P("f"), &st));
        CHECK(st.st_uid == 4242 && st.st_gid == 4343, "chown as root");
        OK(chown(P("f"), 0, 0));
    }
    FAILS(chmod(P("missing"), 0600), ENOENT);
    /* statfs */
    struct statfs sf;
    struct statvfs sv;
    OK(statfs(base, &sf));
    CHECK(sf.f_blocks > 0 && sf.f_bsize > 0, "statfs");
    OK(statvfs(P("f"), &sv));
    CHECK(sv.f_blocks > 0, "statvfs");
    fd = open(P("f"), O_RDONLY);
    OK(fstatfs(fd, &sf));
    OK(fstatvfs(fd, &sv));
    close(fd);
    /* realpath */
    char rp[PATH_MAX];
    CHECK(realpath(P("d/../sym"), rp) && !strcmp(rp, P("f")), "realpath %s", rp);
    FAILS(realpath(P("nope/x"), rp) == NULL ? -1 : 0, ENOENT);
    /* mkstemp */
    char tmpl[PATH_MAX];
    snprintf(tmpl, sizeof tmpl, "%s/tmpXXXXXX", base);
    fd = mkstemp(tmpl);
    OK(fd);
    CHECK(strncmp(tmpl, base, strlen(base)) == 0 && !strstr(tmpl, "XXXXXX"), "mkstemp %s", tmpl);
    CHECK(write(fd, "t", 1) == 1, "write tmp");
    close(fd);
    OK(unlink(tmpl));
    section("meta");
}

static int names_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void dirs(void) {
    OK(mkdir(P("ls"), 0755));
    for (int i = 0; i < 300; i++) {
        char n[64];
        snprintf(n, sizeof n, "ls/n%03d", i);
        int fd = open(P(n), O_CREAT | O_WRONLY, 0644);
        CHECK(fd >= 0, "create %s", n);
        close(fd);
    }
    OK(mkdir(P("ls/zdir"), 0755));
    DIR *d = opendir(P("ls"));
    CHECK(d != NULL, "opendir");
    if (!d) return;
    int count = 0, dots = 0, dirs_seen = 0;
    long mark = -1;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) dots++;
        else count++;
        if (e->d_type == DT_DIR && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) dirs_seen++;
        if (count == 100 && mark < 0) mark = telldir(d);
    }
    CHECK(errno == 0, "readdir end leaves errno 0");
    CHECK(count == 301 && dots == 2 && dirs_seen == 1, "readdir %d %d %d", count, dots, dirs_seen);
    seekdir(d, mark);
    int rest = 0;
    while (readdir64(d)) rest++;
    CHECK(rest == 201, "seekdir then %d", rest);
    rewinddir(d);
    int again = 0;
    while (readdir(d)) again++;
    CHECK(again == 303, "rewinddir %d", again);
    int fd = dirfd(d);
    struct stat st;
    OK(fstat(fd, &st));
    CHECK(S_ISDIR(st.st_mode), "dirfd");
    OK(closedir(d));
    /* fdopendir on an fd from open(O_DIRECTORY) */
    fd = open(P("ls"), O_RDONLY | O_DIRECTORY);
    d = fdopendir(fd);
    CHECK(d != NULL, "fdopendir");
    int n = 0;
    while (d && readdir(d)) n++;
    CHECK(n == 303, "fdopendir entries %d", n);
    if (d) closedir(d);
    /* getdents64 */
    fd = open(P("ls"), O_RDONLY | O_DIRECTORY);
    char buf[4096];
    ssize_t k;
    n = 0;
    while ((k = getdents64(fd, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < k;) {
            struct dirent64 *de = (struct dirent64 *)(buf + off);
            n++;
            off += de->d_reclen;
        }
    }
    CHECK(k == 0 && n == 303, "getdents64 %d", n);
    close(fd);
    /* scandir, sorted */
    struct dirent **list;
    n = scandir(P("ls"), &list, NULL, alphasort);
    CHECK(n == 303 && !strcmp(list[2]->d_name, "n000") && !strcmp(list[302]->d_name, "zdir"),
          "scandir %d", n);
    for (int i = 0; i < n; i++) free(list[i]);
    if (n >= 0) free(list);
    FAILS(opendir(P("f")) == NULL ? -1 : 0, ENOTDIR);
    FAILS(opendir(P("missing")) == NULL ? -1 : 0, ENOENT);
    (void)names_cmp;
    section("dirs");
}

static void cwd(void) {
    char here[PATH_MAX], got[PATH_MAX];
    CHECK(getcwd(here, sizeof here) != NULL, "getcwd");
    OK(chdir(base));
    CHECK(getcwd(got, sizeof got) && !strcmp(got, base), "getcwd in MadFS: %s", got);
    int fd = open("rel", O_CREAT | O_WRONLY, 0644);
    OK(fd);
    close(fd);
    struct stat st;
    OK(stat("rel", &st));
    OK(chdir("d"));
    OK(stat("../rel", &st));
    OK(access("g3", F_OK));
    OK(chdir(".."));
    CHECK(getcwd(got, sizeof got) && !strcmp(got, base), "back up: %s", got);
    char small[4];
    FAILS(getcwd(small, sizeof small) == NULL ? -1 : 0, ERANGE);
    char *dyn = getcwd(NULL, 0);
    CHECK(dyn && !strcmp(dyn, base), "getcwd(NULL)");
    free(dyn);
    FAILS(chdir("f"), ENOTDIR);
    FAILS(chdir("missing"), ENOENT);
    /* fchdir into and out of MadFS */
    int out = open(here, O_RDONLY | O_DIRECTORY);
    int in = open(P("d"), O_RDONLY | O_DIRECTORY);
    OK(fchdir(out));
    CHECK(getcwd(got, sizeof got) && !strcmp(got, here), "fchdir out: %s", got);
    OK(fchdir(in));
    CHECK(getcwd(got, sizeof got) && !strcmp(got, P("d")), "fchdir in: %s", got);
    OK(access("g3", F_OK));
    OK(chdir(local));
    CHECK(getcwd(got, sizeof got) && !strcmp(got, local), "chdir out: %s", got);
    fd = open("kernel-file", O_CREAT | O_WRONLY, 0644);
    OK(fd);
    close(fd);
    OK(stat(L("kernel-file"), &st));
    OK(chdir(here));
    close(out);
    close(in);
    section("cwd");
}

static void fds(void) {
    int fd = open(P("dupf"), O_CREAT | O_RDWR | O_TRUNC, 0644);
    OK(fd);
    int d1 = dup(fd);
    OK(d1);
    CHECK(write(fd, "abc", 3) == 3, "write");
    CHECK(lseek(d1, 0, SEEK_CUR) == 3, "dup shares the offset");
    int d2 = dup2(fd, 50);
    CHECK(d2 == 50, "dup2");
    CHECK(write(50, "def", 3) == 3, "write dup2");
    int d3 = dup3(fd, 51, O_CLOEXEC);
    CHECK(d3 == 51 && (fcntl(51, F_GETFD) & FD_CLOEXEC), "dup3 cloexec");
    int d4 = fcntl(fd, F_DUPFD, 60);
    CHECK(d4 >= 60, "F_DUPFD");
    int d5 = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    CHECK(d5 >= 0 && (fcntl(d5, F_GETFD) & FD_CLOEXEC), "F_DUPFD_CLOEXEC");
    CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR, "F_GETFL");
    OK(fcntl(fd, F_SETFD, FD_CLOEXEC));
    CHECK(fcntl(fd, F_GETFD) == FD_CLOEXEC, "F_SETFD");
    OK(close(fd));
    CHECK(pwrite(d4, "!", 1, 0) == 1, "dup survives close of the original");
    CHECK(lseek(d5, 0, SEEK_CUR) == 6, "shared offset %ld", (long)lseek(d5, 0, SEEK_CUR));
    OK(fcntl(d5, F_SETFL, O_APPEND));
    CHECK(fcntl(d5, F_GETFL) & O_APPEND, "F_SETFL O_APPEND");
    CHECK(pwrite(d5, "+", 1, 0) == 1, "append");
    char buf[16] = {0};
    CHECK(pread(d1, buf, 16, 0) == 7 && !memcmp(buf, "!bcdef+", 7), "content %s", buf);
    /* dup2 of a kernel fd over ours closes ours */
    int k = open("/dev/null", O_RDONLY);
    OK(dup2(k, 50));
    struct stat st;
    OK(fstat(50, &st));
    CHECK(S_ISCHR(st.st_mode), "kernel fd replaced ours");
    FAILS(flock(d1, LOCK_EX), ENOTSUP);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    FAILS(fcntl(d1, F_SETLK, &fl), ENOTSUP);
    close(k);
    close(50);
    close(51);
    close(d1);
    close(d4);
    close(d5);
    /* copies between ours and the kernel's */
    int src = open(P("large"), O_RDONLY);
    int dst = open(L("copy"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    off_t total = 0;
    ssize_t n;
    while ((n = sendfile(dst, src, NULL, 1 << 20)) > 0) total += n;
    CHECK(total == 3 * 1024 * 1024 + 4097, "sendfile %ld", (long)total);
    close(dst);
    lseek(src, 0, SEEK_SET);
    dst = open(P("copy2"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    total = 0;
    while ((n = copy_file_range(src, NULL, dst, NULL, 1 << 20, 0)) > 0) total += n;
    CHECK(total == 3 * 1024 * 1024 + 4097, "copy_file_range %ld", (long)total);
    close(dst);
    close(src);
    OK(posix_fadvise(open(P("copy2"), O_RDONLY), 0, 0, POSIX_FADV_SEQUENTIAL) == 0 ? 0 : -1);
    fd = open(P("alloc"), O_CREAT | O_RDWR, 0644);
    CHECK(posix_fallocate(fd, 0, 10000) == 0, "posix_fallocate");
    OK(fstat(fd, &st));
    CHECK(st.st_size == 10000, "fallocate size");
    close(fd);
    section("fds");
}

static void stdio(void) {
    FILE *f = fopen(P("stdio"), "w");
    CHECK(f != NULL, "fopen w");
    if (!f) return;
    CHECK(fileno(f) >= 0, "fileno of our stream");
    for (int i = 0; i < 5000; i++) fprintf(f, "line %d\n", i);
    CHECK(fflush(f) == 0, "fflush");
    CHECK(ftell(f) > 0, "ftell");
    CHECK(fclose(f) == 0, "fclose");
    f = fopen(P("stdio"), "r");
    char line[64];
    int n = 0, ok = 1;
    while (fgets(line, sizeof line, f)) {
        char want[64];
        snprintf(want, sizeof want, "line %d\n", n);
        ok &= !strcmp(line, want);
        n++;
    }
    CHECK(n == 5000 && ok, "fgets %d", n);
    CHECK(fseek(f, 5, SEEK_SET) == 0 && fgetc(f) == '0', "fseek");
    rewind(f);
    char buf[10] = {0};
    CHECK(fread(buf, 1, 9, f) == 9 && !memcmp(buf, "line 0\nli", 9), "fread");
    fclose(f);
    f = fopen(P("stdio"), "a+");
    CHECK(f && fputs("tail\n", f) >= 0, "append mode");
    fclose(f);
    struct stat st;
    OK(stat(P("stdio"), &st));
    FILE *g = fopen(P("stdio"), "r");
    fseek(g, -5, SEEK_END);
    CHECK(fgets(line, sizeof line, g) && !strcmp(line, "tail\n"), "appended %s", line);
    fclose(g);
    int fd = open(P("stdio2"), O_CREAT | O_RDWR, 0644);
    FILE *h = fdopen(fd, "r+");
    CHECK(h && fileno(h) == fd, "fdopen");
    fwrite("xyz", 1, 3, h);
    fclose(h);
    FAILS(close(fd), EBADF);
    errno = 0;
    CHECK(fopen(P("missing/x"), "r") == NULL && errno == ENOENT, "fopen missing");
    CHECK(fopen(P("stdio"), "wx") == NULL && errno == EEXIST, "fopen wx");
    /* freopen stdout onto a MadFS file, then back via the saved fd */
    fflush(stdout);
    int saved = dup(1);
    CHECK(freopen(P("freopened"), "w", stdout) != NULL, "freopen");
    printf("through stdout\n");
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    clearerr(stdout);
    FILE *r = fopen(P("freopened"), "r");
    CHECK(r && fgets(line, sizeof line, r) && !strcmp(line, "through stdout\n"), "freopen content");
    if (r) fclose(r);
    section("stdio");
}

static void processes(void) {
    /* A child writes through an inherited descriptor: the offset is shared. */
    int fd = open(P("forked"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    CHECK(write(fd, "parent1\n", 8) == 8, "write");
    pid_t pid = fork();
    if (pid == 0) {
        int ok = write(fd, "child\n", 6) == 6;
        int fd2 = open(P("child-made"), O_CREAT | O_WRONLY, 0644);
        ok &= fd2 >= 0 && write(fd2, "c", 1) == 1;
        _exit(ok ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child");
    CHECK(write(fd, "parent2\n", 8) == 8, "write after child");
    close(fd);
    char buf[64] = {0};
    fd = open(P("forked"), O_RDONLY);
    CHECK(read(fd, buf, sizeof buf) == 22 && !strcmp(buf, "parent1\nchild\nparent2\n"), "forked: %s", buf);
    close(fd);
    struct stat st;
    OK(stat(P("child-made"), &st));
    CHECK(st.st_size == 1, "child's file size");
    /* exec: a non-CLOEXEC descriptor survives, a CLOEXEC one does not. */
    int keep = open(P("exec-out"), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int gone = open(P("f"), O_RDONLY | O_CLOEXEC);
    pid = fork();
    if (pid == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "echo from-exec >&%d; test -e /proc/self/fd/%d && echo leaked >&%d; exit 0", keep, gone, keep);
        execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exec child");
    close(keep);
    close(gone);
    fd = open(P("exec-out"), O_RDONLY);
    memset(buf, 0, sizeof buf);
    CHECK(read(fd, buf, sizeof buf) == 10 && !strcmp(buf, "from-exec\n"), "exec-out: '%s'", buf);
    close(fd);
    section("processes");
}

/* The d_type getdents64 gives `name` in directory `dir`, or -1. */
static int dtype_of(const char *dir, const char *name) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    char buf[4096];
    ssize_t k;
    int t = -1;
    while (fd >= 0 && (k = getdents64(fd, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < k;) {
            struct dirent64 *de = (struct dirent64 *)(buf + off);
            if (!strcmp(de->d_name, name)) t = de->d_type;
            off += de->d_reclen;
        }
    }
    if (fd >= 0) close(fd);
    return t;
}

/* FIFOs, sockets and devices: made in MadFS, stat/chmod/chown/utimens/
 * rename/unlink work; opening them is ENXIO (the library cannot connect
 * a pipe's users). */
static void special(void) {
    struct stat st;
    OK(mkdir(P("sp"), 0755));
    CHECK(mkfifo(P("sp/fifo"), 0666) == 0, "mkfifo: %s", strerror(errno));
    CHECK(lstat(P("sp/fifo"), &st) == 0 && S_ISFIFO(st.st_mode) && (st.st_mode & 07777) == 0644 &&
              st.st_rdev == 0,
          "stat fifo %o", st.st_mode);
    CHECK(stat(P("sp/fifo"), &st) == 0 && S_ISFIFO(st.st_mode), "stat fifo (follow)");
    FAILS(mkfifo(P("sp/fifo"), 0600), EEXIST);
    FAILS(open(P("sp/fifo"), O_RDONLY | O_NONBLOCK), ENXIO);
    FAILS(open(P("sp/fifo"), O_WRONLY), ENXIO);
    FAILS(fopen(P("sp/fifo"), "r") ? 0 : -1, ENXIO);
    int dfd = open(P("sp"), O_RDONLY | O_DIRECTORY);
    CHECK(mkfifoat(dfd, "fifo-at", 0600) == 0, "mkfifoat: %s", strerror(errno));
    CHECK(fstatat(dfd, "fifo-at", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISFIFO(st.st_mode), "fstatat fifo");
    CHECK(mknodat(dfd, "sock", S_IFSOCK | 0600, 0) == 0, "mknodat socket: %s", strerror(errno));
    CHECK(lstat(P("sp/sock"), &st) == 0 && S_ISSOCK(st.st_mode), "stat socket");
    FAILS(open(P("sp/sock"), O_RDWR), ENXIO);
    FAILS(mknod(P("sp/dir"), S_IFDIR | 0755, 0), EINVAL);
    if (geteuid() == 0) {
        CHECK(mknod(P("sp/chr"), S_IFCHR | 0620, makedev(136, 300)) == 0, "mknod chr: %s", strerror(errno));
        CHECK(lstat(P("sp/chr"), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(136, 300),
              "stat chr rdev %lx", (long)st.st_rdev);
        struct statx sx;
        CHECK(statx(AT_FDCWD, P("sp/chr"), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx) == 0 &&
                  sx.stx_rdev_major == 136 && sx.stx_rdev_minor == 300,
              "statx rdev");
        CHECK(mknod(P("sp/blk"), S_IFBLK | 0600, makedev(8, 1)) == 0, "mknod blk");
        CHECK(lstat(P("sp/blk"), &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == makedev(8, 1), "stat blk");
        FAILS(open(P("sp/blk"), O_RDONLY), ENXIO);
        /* Past 32 bits: glibc's own mknod says EINVAL. */
        FAILS(mknod(P("sp/big"), S_IFCHR | 0600, makedev(5000, 1)), EINVAL);
        CHECK(dtype_of(P("sp"), "chr") == DT_CHR && dtype_of(P("sp"), "blk") == DT_BLK, "d_type devices");
        OK(unlink(P("sp/chr")));
        OK(unlink(P("sp/blk")));
        OK(chown(P("sp/fifo"), 65534, 65534));
        CHECK(lstat(P("sp/fifo"), &st) == 0 && st.st_uid == 65534 && st.st_gid == 65534, "chown fifo");
    } else {
        FAILS(mknod(P("sp/chr"), S_IFCHR | 0620, makedev(136, 300)), EPERM);
    }
    CHECK(dtype_of(P("sp"), "fifo") == DT_FIFO && dtype_of(P("sp"), "sock") == DT_SOCK, "d_type fifo, socket");
    DIR *d = opendir(P("sp"));
    int fifos = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_type == DT_FIFO) fifos++;
    if (d) closedir(d);
    CHECK(fifos == 2, "readdir sees %d FIFOs", fifos);
    OK(chmod(P("sp/fifo"), 0600));
    CHECK(lstat(P("sp/fifo"), &st) == 0 && S_ISFIFO(st.st_mode) && (st.st_mode & 07777) == 0600, "chmod fifo");
    struct timespec times[2] = {{1000000000, 0}, {1200000000, 0}};
    OK(utimensat(AT_FDCWD, P("sp/fifo"), times, 0));
    CHECK(lstat(P("sp/fifo"), &st) == 0 && st.st_mtim.tv_sec == 1200000000, "utimensat fifo");
    FAILS(truncate(P("sp/fifo"), 0), EINVAL);
    OK(rename(P("sp/fifo"), P("sp/fifo2")));
    CHECK(lstat(P("sp/fifo2"), &st) == 0 && S_ISFIFO(st.st_mode), "renamed fifo");
    FAILS(lstat(P("sp/fifo"), &st), ENOENT);
    OK(unlink(P("sp/fifo2")));
    OK(unlinkat(dfd, "fifo-at", 0));
    OK(unlink(P("sp/sock")));
    close(dfd);
    OK(rmdir(P("sp")));

    /* A descriptor keeps the access granted at open: a user who creates a
     * file with mode 0 and O_RDWR writes and ftruncates through it. */
    if (geteuid() == 0) {
        OK(mkdir(P("pub"), 0777));
        OK(chmod(P("pub"), 0777));
        pid_t pid = fork();
        if (pid == 0) {
            if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
                _exit(90);
            int fd = open(P("pub/mode0"), O_CREAT | O_EXCL | O_RDWR, 0);
            if (fd < 0) _exit(91);
            if (write(fd, "abcdef", 6) != 6) _exit(92);
            if (ftruncate(fd, 3) != 0) _exit(93);
            if (pwrite(fd, "Z", 1, 1) != 1) _exit(94);
            struct stat s;
            if (fstat(fd, &s) != 0 || s.st_size != 3 || (s.st_mode & 07777) != 0) _exit(95);
            if (close(fd) != 0) _exit(96);
            /* By path the mode still decides. */
            if (truncate(P("pub/mode0"), 1) == 0 || errno != EACCES) _exit(97);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "mode-0 create, write, ftruncate as a user: %d",
              WEXITSTATUS(status));
        char buf[8] = {0};
        int fd = open(P("pub/mode0"), O_RDONLY);
        CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 3 && !memcmp(buf, "aZc", 3), "mode-0 file content '%s'", buf);
        close(fd);
    }
    section("special");
}

static void errors(void) {
    /* Bad pointers and arguments fail cleanly instead of crashing. */
    FAILS(open(NULL, O_RDONLY), EFAULT);
    FAILS(stat(P("f"), NULL), EFAULT);
    int fd = open(P("f"), O_RDONLY);
    FAILS(read(fd, NULL, 10), EFAULT);
    FAILS(readv(fd, NULL, 1), EFAULT);
    FAILS(readv(fd, NULL, -1), EINVAL);
    FAILS(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), EINVAL);
    close(fd);
    FAILS(setxattr(P("f"), "user.x", "v", 1, 0), ENOTSUP);
    char v[8];
    FAILS(getxattr(P("f"), "user.x", v, sizeof v), ENODATA);
    CHECK(listxattr(P("f"), v, sizeof v) == 0, "listxattr");
    FAILS(symlink("", P("empty-link")), ENOENT);
    char longname[300];
    memset(longname, 'n', sizeof longname);
    longname[299] = 0;
    char lp[PATH_MAX + 400];
    snprintf(lp, sizeof lp, "%s/%s", base, longname);
    FAILS(open(lp, O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
    section("errors");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: posix BASE LOCAL\n");
        return 2;
    }
    snprintf(base, sizeof base, "%s", argv[1]);
    snprintf(local, sizeof local, "%s", argv[2]);
    umask(022);
    if (mkdir(base, 0755) != 0) {
        perror("mkdir base");
        return 2;
    }
    files();
    large();
    meta();
    dirs();
    cwd();
    fds();
    stdio();
    processes();
    special();
    errors();
    printf("failures %d\n", failures);
    return failures > 100 ? 100 : failures;
}
