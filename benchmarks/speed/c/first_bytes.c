/* The floor of a walk by content, without Python: list a folder, then open each
 * file relative to it, read its first 512 bytes and close it. Prints the files
 * and bytes read; benchmarks/speed/bench_folder_walk.py times the process as it times
 * `find`. Usage: first_bytes FOLDER */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int folder = open(argv[1], O_RDONLY | O_DIRECTORY);
    DIR *listing = folder < 0 ? NULL : fdopendir(folder);
    if (listing == NULL) return 2;
    char head[512];
    long files = 0, bytes = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        int fd = openat(folder, entry->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = read(fd, head, sizeof head);
        if (got > 0) bytes += got;
        close(fd);
        files++;
    }
    printf("%ld files, %ld bytes\n", files, bytes);
    return 0;
}
