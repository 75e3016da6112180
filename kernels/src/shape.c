/* Shape copies (issue 54): a range along one dim copied between two tensors of different extents along it
 * (narrow, select, split, unbind, each input of a cat, and their gradients), and a broadcast materialised
 * (expand).  Pure copies: the same bits at any thread count. */
#include "internal.h"

#include <math.h>
#include <string.h>

static int slice_ok(const port_slice_params *p) {
    if (!p || p->outer < 1 || p->inner < 1 || p->ny < 1 || p->nx < 1 || p->len < 1) return 0;
    if (p->y_start < 0 || p->x_start < 0 || p->len > p->ny - p->y_start || p->len > p->nx - p->x_start) return 0;
    if (p->fill != 0 && p->fill != 1) return 0;
    int64_t lim = INT64_C(1) << 40, rows = p->ny > p->nx ? p->ny : p->nx;
    return p->outer <= lim / rows && p->outer * rows <= lim / p->inner;
}

port_status port_slice_copy(float *y, const float *x, const port_slice_params *p) {
    PORT_NOTNULL(y); PORT_NOTNULL(x);
    PORT_CHECK(p != NULL, PORT_ERR_NULL);
    PORT_CHECK(slice_ok(p), PORT_ERR_SHAPE);
    const int64_t outer = p->outer, inner = p->inner, yrow = p->ny * inner, xrow = p->nx * inner;
    const int64_t head = p->y_start * inner, part = p->len * inner, tail = yrow - head - part;
    PORT_CHECK(!port__ranges_overlap(y, (size_t)(outer * yrow) * sizeof(float), x,
                                     (size_t)(outer * xrow) * sizeof(float)), PORT_ERR_ALIAS);
    const float *xs = x + p->x_start * inner;
    const int fill = (int)p->fill;
#pragma omp parallel for schedule(static) if (outer > 1 && outer * part > PORT_PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        float *yo = y + o * yrow;
        if (fill && head) memset(yo, 0, (size_t)head * sizeof(float));
        memcpy(yo + head, xs + o * xrow, (size_t)part * sizeof(float));
        if (fill && tail) memset(yo + head + part, 0, (size_t)tail * sizeof(float));
    }
    return PORT_OK;
}

/* masked_fill: a reference (one element at a time, the mask's offset from the full index) and the kernel
 * (rows of the innermost dim; the mask's row offset once per row) */
port_status port_masked_fill_reference(float *y, const float *x, const uint8_t *mask, int64_t rank, int64_t m_bcast,
                                 const int64_t *dims, float value) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(mask); PORT_NOTNULL(dims);
    int64_t sm[PORT_BINARY_MAX_RANK], ny, nm;
    PORT_CHECK(port__bstrides(rank, m_bcast, dims, sm, &nm, &ny), PORT_ERR_SHAPE);
    PORT_CHECK(!isnan(value), PORT_ERR_ARG);
    for (int64_t e = 0; e < ny; e++) y[e] = mask[port__offset_of(e, rank, dims, sm)] ? value : x[e];
    return PORT_OK;
}

port_status port_masked_fill(float *y, const float *x, const uint8_t *mask, int64_t rank, int64_t m_bcast,
                             const int64_t *dims, float value) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(mask); PORT_NOTNULL(dims);
    int64_t sm[PORT_BINARY_MAX_RANK], ny, nm;
    PORT_CHECK(port__bstrides(rank, m_bcast, dims, sm, &nm, &ny), PORT_ERR_SHAPE);
    PORT_CHECK(!isnan(value), PORT_ERR_ARG);
    PORT_CHECK(y == x || !port__ranges_overlap(y, (size_t)ny * sizeof(float), x, (size_t)ny * sizeof(float)),
               PORT_ERR_ALIAS);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)ny * sizeof(float), mask, (size_t)nm), PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], im = sm[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        float *yo = y + o * inner;
        const float *xo = x + o * inner;
        const uint8_t *mo = mask + port__offset_of(o, rank - 1, dims, sm);
        if (im)
            for (int64_t j = 0; j < inner; j++) yo[j] = mo[j] ? value : xo[j];
        else if (mo[0])
            for (int64_t j = 0; j < inner; j++) yo[j] = value;
        else if (yo != xo)
            memcpy(yo, xo, (size_t)inner * sizeof(float));
    }
    return PORT_OK;
}

port_status port_expand(float *y, const float *x, int64_t rank, int64_t x_bcast, const int64_t *dims) {
    PORT_NOTNULL(y); PORT_NOTNULL(x); PORT_NOTNULL(dims);
    PORT_CHECK(rank >= 1 && rank <= PORT_BINARY_MAX_RANK, PORT_ERR_SHAPE);
    PORT_CHECK(x_bcast >= 0 && !(x_bcast >> rank), PORT_ERR_SHAPE);
    int64_t sx[PORT_BINARY_MAX_RANK], ny, nx;
    PORT_CHECK(port__bstrides(rank, x_bcast, dims, sx, &nx, &ny), PORT_ERR_SHAPE);
    PORT_CHECK(!port__ranges_overlap(y, (size_t)ny * sizeof(float), x, (size_t)nx * sizeof(float)), PORT_ERR_ALIAS);
    const int64_t inner = dims[rank - 1], ix = sx[rank - 1], outer = ny / inner;
#pragma omp parallel for schedule(static) if (ny > PORT_PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        float *yo = y + o * inner;
        const float *xo = x + port__offset_of(o, rank - 1, dims, sx);
        if (ix) memcpy(yo, xo, (size_t)inner * sizeof(float));
        else {
            float v = xo[0];
            for (int64_t j = 0; j < inner; j++) yo[j] = v;
        }
    }
    return PORT_OK;
}
