/* See safetensors_io.h. A tiny JSON scanner: enough for safetensors headers, not general JSON. */
#include "safetensors_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}

/* Copy a JSON string starting at p (which points at the opening quote) into out. */
static const char *parse_string(const char *p, char *out, size_t cap) {
    size_t n = 0;
    if (*p != '"') return NULL;
    p++;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\' && *p) c = *p++;
        if (n + 1 < cap) out[n++] = c;
    }
    if (*p != '"') return NULL;
    out[n] = 0;
    return p + 1;
}

/* Skip any JSON value (object, array, string, number, literal). */
static const char *skip_value(const char *p) {
    p = skip_ws(p);
    if (*p == '"') {
        char tmp[4];
        p++;
        while (*p && *p != '"') { if (*p == '\\' && p[1]) p++; p++; }
        (void)tmp;
        return *p ? p + 1 : NULL;
    }
    if (*p == '{' || *p == '[') {
        int depth = 0;
        do {
            if (*p == '"') { p = skip_value(p); if (!p) return NULL; continue; }
            if (*p == '{' || *p == '[') depth++;
            if (*p == '}' || *p == ']') depth--;
            p++;
        } while (*p && depth > 0);
        return p;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']') p++;
    return p;
}

static const char *parse_int_array(const char *p, int64_t *out, int cap, int *count) {
    p = skip_ws(p);
    if (*p != '[') return NULL;
    p = skip_ws(p + 1);
    *count = 0;
    while (*p && *p != ']') {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) return NULL;
        if (*count < cap) out[(*count)++] = v;
        p = skip_ws(end);
        if (*p == ',') p = skip_ws(p + 1);
    }
    return *p == ']' ? p + 1 : NULL;
}

static size_t dtype_size(const char *dtype) {
    if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "BF16") || !strcmp(dtype, "F16") || !strcmp(dtype, "I16")) return 2;
    if (!strcmp(dtype, "U8") || !strcmp(dtype, "I8") || !strcmp(dtype, "BOOL")) return 1;
    return 0;
}

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int st_read(const char *path, st_file *out, char *err, size_t errlen) {
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "cannot open %s", path); return -1; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    out->buffer = malloc((size_t)size + 1);
    if (!out->buffer || fread(out->buffer, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        snprintf(err, errlen, "cannot read %s", path);
        return -1;
    }
    fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | out->buffer[i];
    if (hlen + 8 > (uint64_t)size) { snprintf(err, errlen, "%s: bad header length", path); return -1; }
    char *header = malloc(hlen + 1);
    memcpy(header, out->buffer + 8, hlen);
    header[hlen] = 0;
    unsigned char *data = out->buffer + 8 + hlen;
    const char *p = skip_ws(header);
    if (*p != '{') { free(header); snprintf(err, errlen, "%s: header is not an object", path); return -1; }
    p = skip_ws(p + 1);
    while (p && *p && *p != '}') {
        char key[128];
        p = parse_string(p, key, sizeof key);
        if (!p) break;
        p = skip_ws(p);
        if (*p != ':') break;
        p = skip_ws(p + 1);
        if (!strcmp(key, "__metadata__") || out->count >= ST_MAX_TENSORS) {
            p = skip_value(p);
        } else {
            st_tensor *t = &out->tensors[out->count++];
            snprintf(t->name, sizeof t->name, "%s", key);
            int64_t offsets[2] = {0, 0};
            int n_off = 0;
            p = skip_ws(p + 1); /* past '{' */
            while (p && *p && *p != '}') {
                char field[32];
                p = parse_string(p, field, sizeof field);
                if (!p) break;
                p = skip_ws(p);
                p = skip_ws(p + 1); /* past ':' */
                if (!strcmp(field, "dtype")) p = parse_string(p, t->dtype, sizeof t->dtype);
                else if (!strcmp(field, "shape")) p = parse_int_array(p, t->shape, ST_MAX_DIMS, &t->ndim);
                else if (!strcmp(field, "data_offsets")) p = parse_int_array(p, offsets, 2, &n_off);
                else p = skip_value(p);
                if (!p) break;
                p = skip_ws(p);
                if (*p == ',') p = skip_ws(p + 1);
            }
            if (!p || n_off != 2) { free(header); snprintf(err, errlen, "%s: bad entry %s", path, key); return -1; }
            p++; /* past '}' */
            t->nbytes = (size_t)(offsets[1] - offsets[0]);
            t->data = data + offsets[0];
        }
        p = skip_ws(p);
        if (*p == ',') p = skip_ws(p + 1);
    }
    free(header);
    return 0;
}

void st_free(st_file *file) {
    free(file->buffer);
    file->buffer = NULL;
}

st_tensor *st_find(st_file *file, const char *name) {
    for (int i = 0; i < file->count; i++)
        if (!strcmp(file->tensors[i].name, name)) return &file->tensors[i];
    return NULL;
}

int st_write(const char *path, st_tensor *tensors, int count, char *err, size_t errlen) {
    size_t cap = 256 + (size_t)count * 256, len = 0, offset = 0;
    char *header = malloc(cap);
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (int i = 0; i < count; i++) {
        st_tensor *t = &tensors[i];
        size_t expect = (size_t)st_numel(t) * dtype_size(t->dtype);
        if (expect != t->nbytes) { free(header); snprintf(err, errlen, "tensor %s: size mismatch", t->name); return -1; }
        len += (size_t)snprintf(header + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(header + len, cap - len, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        len += (size_t)snprintf(header + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", offset, offset + t->nbytes);
        offset += t->nbytes;
    }
    len += (size_t)snprintf(header + len, cap - len, "}");
    while (len % 8) header[len++] = ' '; /* keep the data aligned */
    FILE *f = fopen(path, "wb");
    if (!f) { free(header); snprintf(err, errlen, "cannot write %s", path); return -1; }
    unsigned char lenbytes[8];
    for (int i = 0; i < 8; i++) lenbytes[i] = (unsigned char)(((uint64_t)len >> (8 * i)) & 0xFF);
    fwrite(lenbytes, 1, 8, f);
    fwrite(header, 1, len, f);
    for (int i = 0; i < count; i++) fwrite(tensors[i].data, 1, tensors[i].nbytes, f);
    fclose(f);
    free(header);
    return 0;
}
