/* flatfamily N: fork N children that each wait for EOF on standard input, print "ready"
 * once they all exist, then reap them and exit.  Closing its standard input ends the whole
 * family (each child reads EOF and exits): a flat tree of thousands of processes that
 * costs a few MB and cleans itself up.  Built by tests/test_hostile_live.py with gcc. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0, made = 0;
    for (; made < n; made++) {
        pid_t pid = fork();
        if (pid < 0) break;
        if (pid == 0) {
            char c;
            while (read(0, &c, 1) > 0) {}
            _exit(0);
        }
    }
    printf("ready %d\n", made);
    fflush(stdout);
    while (wait(NULL) > 0) {}
    return made == n ? 0 : 1;
}
