/* A minimal safetensors reader and writer for the conformance subprocess protocol.
 *
 * Reads: the 8-byte little-endian header length, the JSON header (an object of tensor entries
 * {"dtype", "shape", "data_offsets"} plus "__metadata__"), then the data. Only what the
 * protocol needs: dtypes F32, F64, BF16, U8, I32, I64, BOOL; up to 8 dims.
 */
#ifndef SAFETENSORS_IO_H
#define SAFETENSORS_IO_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_TENSORS 64
#define ST_MAX_DIMS 8

typedef struct {
    char name[128];
    char dtype[8];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    void *data; /* owned by the file buffer (reader) or by the caller (writer) */
} st_tensor;

typedef struct {
    int count;
    st_tensor tensors[ST_MAX_TENSORS];
    unsigned char *buffer;
} st_file;

int st_read(const char *path, st_file *out, char *err, size_t errlen);
void st_free(st_file *file);
st_tensor *st_find(st_file *file, const char *name);
int64_t st_numel(const st_tensor *t);
int st_write(const char *path, st_tensor *tensors, int count, char *err, size_t errlen);

#endif
