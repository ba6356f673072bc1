/* A C implementation for the conformance harness's subprocess protocol
 * (docs/subprocess-protocol.md): quant.e2m1, quant.fp4_e8m0 and address.decode.
 *
 *   conformance_c components              list supported components, one per line
 *   conformance_c run COMPONENT IN OUT    one call: read IN.safetensors, write OUT.safetensors
 *   conformance_c serve                   batch mode: "run COMPONENT IN OUT" lines on stdin,
 *                                         answers "ok" or "error <message>" on stdout
 * Written from the semantics in docs (e2m1 ties to the even code; fp4 E8M0 scales are the
 * power-of-two ceiling of amax * fp32(1/6) computed on the IEEE bits, amax floor 6 * 2^-126).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors_io.h"

static const float E2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
static uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/* e2m1 code of v (already within [-6, 6]): ties go to the even code; bit 3 is the sign. */
static uint8_t e2m1_code(float v) {
    float m = fabsf(v);
    uint8_t code;
    if (m <= 0.25f) code = 0;
    else if (m < 0.75f) code = 1;
    else if (m <= 1.25f) code = 2;
    else if (m < 1.75f) code = 3;
    else if (m <= 2.5f) code = 4;
    else if (m < 3.5f) code = 5;
    else if (m <= 5.0f) code = 6;
    else code = 7;
    return (uint8_t)(code | (signbit(v) ? 8 : 0));
}
static float e2m1_value(uint8_t code) { return (code & 8) ? -E2M1[code & 7] : E2M1[code & 7]; }

/* Power-of-two ceiling on the IEEE bits of a positive normal float. */
static uint32_t pow2_ceil_exponent(float y) {
    uint32_t bits = f32_bits(y);
    uint32_t e = (bits >> 23) & 0xFF;
    return e + ((bits & 0x7FFFFFu) != 0);
}

static int check(st_tensor *t, const char *name, const char *dtype, char *err, size_t n) {
    if (!t) { snprintf(err, n, "input '%s' missing", name); return -1; }
    if (dtype && strcmp(t->dtype, dtype)) { snprintf(err, n, "input '%s' has dtype %s, expected %s", name, t->dtype, dtype); return -1; }
    return 0;
}

static int64_t param_int(st_file *in, const char *name, int64_t fallback) {
    char key[96];
    snprintf(key, sizeof key, "param.%s", name);
    st_tensor *t = st_find(in, key);
    if (!t || strcmp(t->dtype, "I64")) return fallback;
    return *(int64_t *)t->data;
}

static st_tensor make(const char *name, const char *dtype, const st_tensor *like, size_t elem, void **data) {
    st_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
    t.ndim = like->ndim;
    memcpy(t.shape, like->shape, sizeof t.shape);
    t.nbytes = (size_t)st_numel(like) * elem;
    t.data = calloc(t.nbytes ? t.nbytes : 1, 1);
    *data = t.data;
    return t;
}

static int quant_e2m1(st_file *in, st_tensor *out, int *count, char *err, size_t n) {
    st_tensor *v = st_find(in, "v");
    if (check(v, "v", "F32", err, n)) return -1;
    int64_t numel = st_numel(v);
    uint8_t *codes;
    float *y;
    out[0] = make("codes", "U8", v, 1, (void **)&codes);
    out[1] = make("y", "F32", v, 4, (void **)&y);
    const float *x = v->data;
    for (int64_t i = 0; i < numel; i++) {
        float c = fminf(fmaxf(x[i], -6.0f), 6.0f);
        if (signbit(x[i]) && c == 0.0f) c = -0.0f;
        codes[i] = e2m1_code(c);
        y[i] = e2m1_value(codes[i]);
    }
    *count = 2;
    return 0;
}

static int quant_fp4_e8m0(st_file *in, st_tensor *out, int *count, char *err, size_t n) {
    const int block = 32;
    st_tensor *x = st_find(in, "x");
    if (check(x, "x", "BF16", err, n)) return -1;
    int64_t numel = st_numel(x), last = x->shape[x->ndim - 1];
    if (last % block) { snprintf(err, n, "last dim %lld is not a multiple of %d", (long long)last, block); return -1; }
    uint16_t *y;
    uint8_t *codes, *scales;
    out[0] = make("y", "BF16", x, 2, (void **)&y);
    out[1] = make("codes", "U8", x, 1, (void **)&codes);
    st_tensor shape = *x;
    shape.shape[x->ndim - 1] = last / block;
    out[2] = make("scale_bytes", "U8", &shape, 1, (void **)&scales);
    const uint16_t *xs = x->data;
    const float inv6 = (float)(1.0 / 6.0), floor_amax = 6.0f * ldexpf(1.0f, -126);
    for (int64_t b = 0; b < numel / block; b++) {
        float amax = 0.0f;
        for (int j = 0; j < block; j++) amax = fmaxf(amax, fabsf(bf16_to_f32(xs[b * block + j])));
        amax = fmaxf(amax, floor_amax);
        uint32_t e = pow2_ceil_exponent(amax * inv6);
        float scale = bits_f32(e << 23);
        scales[b] = (uint8_t)e;
        for (int j = 0; j < block; j++) {
            float v = bf16_to_f32(xs[b * block + j]) / scale;
            v = fminf(fmaxf(v, -6.0f), 6.0f);
            uint8_t code = e2m1_code(v);
            codes[b * block + j] = code;
            y[b * block + j] = f32_to_bf16(e2m1_value(code) * scale);
        }
    }
    *count = 3;
    return 0;
}

static int64_t read_int(const st_tensor *t, int64_t i) {
    return !strcmp(t->dtype, "I64") ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

static int address_decode(st_file *in, st_tensor *out, int *count, char *err, size_t n) {
    st_tensor *ids = st_find(in, "ids"), *table = st_find(in, "block_table");
    if (check(ids, "ids", NULL, err, n) || check(table, "block_table", NULL, err, n)) return -1;
    int64_t block_size = param_int(in, "block_size", -1), ratio = param_int(in, "ratio", -1);
    if (block_size <= 0 || ratio <= 0 || block_size % ratio) {
        snprintf(err, n, "params block_size %lld and ratio %lld must be positive with ratio dividing block_size",
                 (long long)block_size, (long long)ratio);
        return -1;
    }
    int64_t rows_per_block = block_size / ratio, numel = st_numel(ids);
    int64_t per_batch = table->ndim == 2 ? table->shape[1] : st_numel(table);
    int64_t lanes_per_batch = table->ndim == 2 ? numel / table->shape[0] : numel;
    int32_t *slots32 = NULL;
    int64_t *slots64 = NULL;
    int wide = !strcmp(ids->dtype, "I64");
    out[0] = make("slots", wide ? "I64" : "I32", ids, wide ? 8 : 4, wide ? (void **)&slots64 : (void **)&slots32);
    for (int64_t i = 0; i < numel; i++) {
        int64_t j = read_int(ids, i), slot = -1;
        if (j >= 0) {
            int64_t batch = table->ndim == 2 ? i / lanes_per_batch : 0, blk = j / rows_per_block;
            if (blk >= per_batch) { snprintf(err, n, "id %lld points past the block table", (long long)j); return -1; }
            slot = read_int(table, batch * per_batch + blk) * rows_per_block + j % rows_per_block;
        }
        if (wide) slots64[i] = slot; else slots32[i] = (int32_t)slot;
    }
    *count = 1;
    return 0;
}

typedef int (*component_fn)(st_file *, st_tensor *, int *, char *, size_t);
static const struct { const char *name; component_fn fn; } COMPONENTS[] = {
    {"quant.e2m1", quant_e2m1}, {"quant.fp4_e8m0", quant_fp4_e8m0}, {"address.decode", address_decode},
};

static int run_one(const char *component, const char *in_path, const char *out_path, char *err, size_t n) {
    component_fn fn = NULL;
    for (size_t i = 0; i < sizeof COMPONENTS / sizeof COMPONENTS[0]; i++)
        if (!strcmp(COMPONENTS[i].name, component)) fn = COMPONENTS[i].fn;
    if (!fn) { snprintf(err, n, "unsupported component %s", component); return -1; }
    st_file in;
    if (st_read(in_path, &in, err, n)) { st_free(&in); return -1; }
    st_tensor out[8];
    int count = 0, rc = fn(&in, out, &count, err, n);
    if (!rc) rc = st_write(out_path, out, count, err, n);
    for (int i = 0; i < count; i++) free(out[i].data);
    st_free(&in);
    return rc;
}

int main(int argc, char **argv) {
    char err[512] = "";
    if (argc == 2 && !strcmp(argv[1], "components")) {
        for (size_t i = 0; i < sizeof COMPONENTS / sizeof COMPONENTS[0]; i++) printf("%s\n", COMPONENTS[i].name);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "run")) {
        if (run_one(argv[2], argv[3], argv[4], err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "serve")) {
        char line[4096], component[256], in_path[2048], out_path[2048];
        while (fgets(line, sizeof line, stdin)) {
            if (sscanf(line, "run %255s %2047s %2047s", component, in_path, out_path) != 3) {
                printf("error malformed request\n");
            } else if (run_one(component, in_path, out_path, err, sizeof err)) {
                printf("error %s\n", err);
            } else {
                printf("ok\n");
            }
            fflush(stdout);
        }
        return 0;
    }
    fprintf(stderr, "usage: %s components | run COMPONENT IN OUT | serve\n", argv[0]);
    return 2;
}
