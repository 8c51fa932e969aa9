/* The native anchor: the MPI library's own collectives, timed, for SMPI.
 *
 *   smpicc -O2 -o anchor anchor.c
 *   smpirun -np 64 -platform P.xml -hostfile H --cfg=smpi/coll-selector:mpich ./anchor allreduce,bcast 8,1024 [PPN]
 *
 * "cross_allreduce" is hierarchical's step across nodes done by the library:
 * MPI_Allreduce of the given bytes on each of the PPN communicators of one
 * rank per node (MPI_Comm_split by rank % PPN, as node.py splits by local
 * rank), all at once, as hierarchical runs them.
 *
 * For each collective and size (bytes, float32 elements for the reductions,
 * bytes for bcast/allgather), one untimed call and then ITERS timed ones;
 * prints "collective p bytes seconds_per_call" per line on rank 0, the time
 * being the slowest rank's. Under SMPI the clock is simulated, so a few
 * iterations give the exact figure (no noise to average away).
 *
 * Buffers come from SMPI_SHARED_MALLOC when built by smpicc: every rank of
 * the simulation (one process) shares one allocation, so p = 1024 at 64 MiB
 * fits in memory; the values are then garbage, which is fine: only the
 * time is kept.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SMPI_SHARED_MALLOC
#define ALLOC(n) SMPI_SHARED_MALLOC(n)
#define FREE(p) SMPI_SHARED_FREE(p)
#else
#define ALLOC(n) malloc(n)
#define FREE(p) free(p)
#endif

#define ITERS 2

static double run(const char *coll, long nbytes, int p, void *a, void *b, MPI_Comm cross)
{
    int count = (int)(nbytes / 4);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = 0;
    for (int it = 0; it <= ITERS; it++) {
        if (it == 1)  /* the first call is a warm-up */
            t0 = MPI_Wtime();
        if (!strcmp(coll, "allreduce"))
            MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (!strcmp(coll, "cross_allreduce"))
            MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, cross);
        else if (!strcmp(coll, "bcast"))
            MPI_Bcast(a, (int)nbytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        else if (!strcmp(coll, "reduce_scatter"))  /* nbytes in all: count / p per rank (rounded down) */
            MPI_Reduce_scatter_block(a, b, count / p, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (!strcmp(coll, "allgather"))  /* nbytes in all: nbytes / p from each rank */
            MPI_Allgather(a, (int)(nbytes / p), MPI_BYTE, b, (int)(nbytes / p), MPI_BYTE, MPI_COMM_WORLD);
        else {
            fprintf(stderr, "anchor: unknown collective %s\n", coll);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    double mine = (MPI_Wtime() - t0) / ITERS, slowest = 0;
    /* An all-reduce, not MPI_Reduce to rank 0: under SMPI 3.32 with the
     * ompi selector, ranks leaving MPI_Reduce early made the next call's
     * messages go astray ("Actor ... is gone??"). */
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc != 3 && argc != 4) {
        if (rank == 0)
            fprintf(stderr, "usage: anchor COLLECTIVE[,COLLECTIVE...] BYTES[,BYTES...] [PPN]\n");
        MPI_Finalize();
        return 2;
    }
    int ppn = argc == 4 ? atoi(argv[3]) : 1;
    MPI_Comm cross;
    MPI_Comm_split(MPI_COMM_WORLD, rank % (ppn > 0 ? ppn : 1), rank, &cross);
    long largest = 0;
    for (char *s = argv[2]; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
        if (atol(s) > largest)
            largest = atol(s);
    /* allgather's receive buffer holds every rank's block: nbytes in all */
    void *a = ALLOC(largest + 64), *b = ALLOC(largest + 64);
    char colls[256];
    snprintf(colls, sizeof colls, "%s", argv[1]);
    for (char *coll = strtok(colls, ","); coll; coll = strtok(NULL, ",")) {
        for (char *s = argv[2]; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
            long nbytes = atol(s);
            double t = run(coll, nbytes, p, a, b, cross);
            if (rank == 0) {
                printf("%s %d %ld %.9e\n", coll, p, nbytes, t);
                fflush(stdout);
            }
        }
    }
    /* Every rank done with the shared buffers before any frees them (SMPI
     * reported a deadlock at exit without this barrier). */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&cross);
    FREE(a);
    FREE(b);
    MPI_Finalize();
    return 0;
}
