/* The native token log of one request: the per-token hot path of llmslo.telemetry in C.
 *
 * Same contract as the pure-Python TokenLog in _tokenlog.py (the tests run both on the same inputs):
 * commit(k=1, proposed=0) records one commit event (k tokens, a monotonic timestamp in nanoseconds),
 * send(n=1) counts tokens handed to the transport, and the read side gives what the terminal state
 * needs: commits up to a time, tokens in them, the token-weighted ITL histogram and the gaps.
 * expect_plain(prefix, suffix) and commit_plain(body) are the per-chunk shortcut of a streamed reply: a body
 * that is prefix + text + suffix, its text non-empty and holding no quote, is one plain content chunk of the
 * stream and commits one token, in one call (see _reply_observer.py for why that shape says so).
 * summary_json(row), beside it, writes a request's summary as the sink's JSONL line: the other per-request cost
 * every server that keeps summaries pays (see its section below).
 *
 * Nothing in the token log raises on bad data: an invalid count, a clock that fails or memory that runs out is
 * counted in `invalid` and the call does nothing else. A call that does not match the signature (an unknown
 * keyword, too many arguments) raises TypeError, as a Python method would. Every method runs under the GIL and calls no
 * Python code except an injected clock, so calls are atomic with respect to each other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

/* The most tokens one commit may carry (as in _tokenlog.py): far above any reply, and it bounds what one
 * bad count can cost (the token-weighted gaps hold k samples per commit). */
#define K_MAX (1LL << 20)

typedef struct {
    PyObject_HEAD
    int64_t *times;      /* commit times, ns */
    int32_t *ks;         /* tokens per commit; NULL while every commit was one token */
    Py_ssize_t n;        /* commits recorded */
    Py_ssize_t cap;      /* room in times (and ks) */
    PyObject *clock;     /* NULL: CLOCK_MONOTONIC read directly (what time.monotonic_ns reads on Linux) */
    long long sent;      /* tokens handed to the transport */
    long long proposed;  /* draft tokens proposed */
    long long invalid;   /* calls ignored: bad count, failed clock, no memory */
    PyObject *prefix;    /* bytes: the plain content chunk's bytes before its text; NULL: none expected */
    PyObject *suffix;    /* bytes: its bytes from the quote closing the text */
} TokenLog;

static int
grow(TokenLog *self)
{
    Py_ssize_t cap = self->cap ? self->cap * 2 : 64;
    int64_t *times = PyMem_Realloc(self->times, (size_t)cap * sizeof(int64_t));
    if (times == NULL) {
        return -1;
    }
    self->times = times;
    if (self->ks != NULL) {
        int32_t *ks = PyMem_Realloc(self->ks, (size_t)cap * sizeof(int32_t));
        if (ks == NULL) {
            return -1;
        }
        self->ks = ks;
    }
    self->cap = cap;
    return 0;
}

/* The clock now, ns; 0 with self->invalid counted when an injected clock fails. */
static int
now_ns(TokenLog *self, int64_t *out)
{
    if (self->clock == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
    PyObject *value = PyObject_CallNoArgs(self->clock);
    if (value == NULL) {
        PyErr_Clear();
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = v;
    return 0;
}

/* A non-negative count from obj (an int, bool included), or -1 when it is not one. */
static long long
count_of(PyObject *obj)
{
    if (!PyLong_Check(obj)) {
        return -1;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return v < 0 ? -1 : v;
}

/* Arguments (first=..., second=...) like a Python signature; a wrong call raises TypeError, as it would
 * for the pure-Python log: a mistake in the calling code, not bad data. second may be NULL (one argument). */
static int
parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *first,
           const char *second, PyObject **a, PyObject **b)
{
    Py_ssize_t most = second == NULL ? 1 : 2;
    if (nargs > most) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fname, most, nargs);
        return -1;
    }
    if (nargs >= 1) {
        *a = args[0];
    }
    if (nargs == 2) {
        *b = args[1];
    }
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            PyObject *value = args[nargs + i];
            if (first != NULL && PyUnicode_CompareWithASCIIString(name, first) == 0 && nargs < 1) {
                *a = value;
            }
            else if (second != NULL && PyUnicode_CompareWithASCIIString(name, second) == 0 && nargs < 2) {
                *b = value;
            }
            else {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated keyword argument '%U'",
                             fname, name);
                return -1;
            }
        }
    }
    return 0;
}

static PyObject *
TokenLog_commit(TokenLog *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    long long k = 1, proposed = 0;
    if (nargs != 0 || kwnames != NULL) {
        PyObject *ko = NULL, *po = NULL;
        if (parse_args("commit", args, nargs, kwnames, "k", "proposed", &ko, &po) < 0) {
            return NULL;
        }
        if (ko != NULL) {
            k = count_of(ko);
            if (k < 1 || k > K_MAX) {
                self->invalid++;
                Py_RETURN_NONE;
            }
        }
        if (po != NULL) {
            proposed = count_of(po);
            if (proposed < 0) {
                self->invalid++;
                proposed = 0;
            }
        }
    }
    int64_t t;
    if (now_ns(self, &t) < 0 || (self->n == self->cap && grow(self) < 0)) {
        self->invalid++;
        Py_RETURN_NONE;
    }
    if (k != 1 && self->ks == NULL) {
        self->ks = PyMem_Malloc((size_t)self->cap * sizeof(int32_t));
        if (self->ks == NULL) {
            self->invalid++;
            Py_RETURN_NONE;
        }
        for (Py_ssize_t i = 0; i < self->n; i++) {
            self->ks[i] = 1;
        }
    }
    self->times[self->n] = t;
    if (self->ks != NULL) {
        self->ks[self->n] = (int32_t)k;
    }
    self->n++;
    self->proposed += proposed;
    Py_RETURN_NONE;
}

static PyObject *
TokenLog_send(TokenLog *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    long long n = 1;
    if (nargs != 0 || kwnames != NULL) {
        PyObject *no = NULL;
        if (parse_args("send", args, nargs, kwnames, "n", NULL, &no, &no) < 0) {
            return NULL;
        }
        if (no != NULL) {
            n = count_of(no);
            if (n < 0) {
                self->invalid++;
                Py_RETURN_NONE;
            }
        }
    }
    self->sent += n;
    Py_RETURN_NONE;
}

/* Record one commit of one token now; -1 (counted in invalid) when the clock or memory fails. */
static int
commit_one(TokenLog *self)
{
    int64_t t;
    if (now_ns(self, &t) < 0 || (self->n == self->cap && grow(self) < 0)) {
        self->invalid++;
        return -1;
    }
    self->times[self->n] = t;
    if (self->ks != NULL) {
        self->ks[self->n] = 1;
    }
    self->n++;
    return 0;
}

static PyObject *
TokenLog_expect_plain(TokenLog *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "expect_plain() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *prefix = args[0], *suffix = args[1];
    if (prefix == Py_None) {
        Py_CLEAR(self->prefix);
        Py_CLEAR(self->suffix);
        Py_RETURN_NONE;
    }
    if (!PyBytes_CheckExact(prefix) || !PyBytes_CheckExact(suffix)) {
        PyErr_SetString(PyExc_TypeError, "expect_plain(prefix, suffix): bytes, or None to expect none");
        return NULL;
    }
    Py_XSETREF(self->prefix, Py_NewRef(prefix));
    Py_XSETREF(self->suffix, Py_NewRef(suffix));
    Py_RETURN_NONE;
}

static PyObject *
TokenLog_commit_plain(TokenLog *self, PyObject *body)
{
    PyObject *prefix = self->prefix;
    if (prefix == NULL || !PyBytes_CheckExact(body)) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    Py_ssize_t plen = PyBytes_GET_SIZE(prefix), slen = PyBytes_GET_SIZE(self->suffix);
    if (size <= plen + slen) {
        Py_RETURN_FALSE;  /* no text between them */
    }
    const char *data = PyBytes_AS_STRING(body);
    if (memcmp(data, PyBytes_AS_STRING(prefix), (size_t)plen) != 0
            || memcmp(data + size - slen, PyBytes_AS_STRING(self->suffix), (size_t)slen) != 0
            || memchr(data + plen, '"', (size_t)(size - slen - plen)) != NULL) {
        Py_RETURN_FALSE;
    }
    commit_one(self);
    Py_RETURN_TRUE;
}

/* The index argument of a read method: 0 <= m <= n. */
static int
prefix_of(TokenLog *self, PyObject *arg, Py_ssize_t *m)
{
    Py_ssize_t v = PyLong_AsSsize_t(arg);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0 || v > self->n) {
        PyErr_Format(PyExc_IndexError, "commit prefix %zd outside 0..%zd", v, self->n);
        return -1;
    }
    *m = v;
    return 0;
}

static PyObject *
TokenLog_count_until(TokenLog *self, PyObject *arg)
{
    long long until = PyLong_AsLongLong(arg);
    if (until == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t m = self->n;
    while (m > 0 && self->times[m - 1] > until) {
        m--;
    }
    return PyLong_FromSsize_t(m);
}

static PyObject *
TokenLog_time_ns(TokenLog *self, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (i < 0 || i >= self->n) {
        PyErr_Format(PyExc_IndexError, "commit %zd outside 0..%zd", i, self->n - 1);
        return NULL;
    }
    return PyLong_FromLongLong(self->times[i]);
}

static PyObject *
TokenLog_generated(TokenLog *self, PyObject *arg)
{
    Py_ssize_t m;
    if (prefix_of(self, arg, &m) < 0) {
        return NULL;
    }
    if (self->ks == NULL) {
        return PyLong_FromSsize_t(m);
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        total += self->ks[i];
    }
    return PyLong_FromLongLong(total);
}

/* ceil(g / k) for k >= 1: a gap of g ns over k tokens is at most a bound b (ns) exactly when this is. */
static inline int64_t
per_token_ceil(int64_t g, int64_t k)
{
    int64_t q = g / k;
    return (g % k != 0 && g > 0) ? q + 1 : q;
}

static PyObject *
TokenLog_itl(TokenLog *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "itl(m, bounds_ns) takes two arguments");
        return NULL;
    }
    Py_ssize_t m;
    if (prefix_of(self, args[0], &m) < 0) {
        return NULL;
    }
    if (m < 2) {
        Py_RETURN_NONE;
    }
    PyObject *seq = PySequence_Fast(args[1], "bounds_ns must be a sequence of ints");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
    int64_t *bounds = PyMem_Malloc((size_t)(nb + 1) * sizeof(int64_t));
    long long *counts = PyMem_Calloc((size_t)nb + 1, sizeof(long long));
    PyObject *result = NULL, *list = NULL;
    if (bounds == NULL || counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < nb; j++) {
        bounds[j] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, j));
        if (bounds[j] == -1 && PyErr_Occurred()) {
            goto done;
        }
    }
    double hi = 0.0;
    int have_hi = 0;
    for (Py_ssize_t i = 1; i < m; i++) {
        int64_t g = self->times[i] - self->times[i - 1];
        int64_t k = self->ks == NULL ? 1 : self->ks[i];
        int64_t c = k == 1 ? g : per_token_ceil(g, k);
        /* first bound >= c (bisect_left): a gap equal to a bound counts in that bound's bucket */
        Py_ssize_t lo = 0, up = nb;
        while (lo < up) {
            Py_ssize_t mid = (lo + up) / 2;
            if (bounds[mid] < c) {
                lo = mid + 1;
            }
            else {
                up = mid;
            }
        }
        counts[lo] += k;
        double v = k == 1 ? (double)g : (double)g / (double)k;
        if (!have_hi || v > hi) {
            hi = v;
            have_hi = 1;
        }
    }
    list = PyList_New(nb + 1);
    if (list == NULL) {
        goto done;
    }
    for (Py_ssize_t j = 0; j <= nb; j++) {
        PyObject *c = PyLong_FromLongLong(counts[j]);
        if (c == NULL) {
            goto done;
        }
        PyList_SET_ITEM(list, j, c);
    }
    double total_s = (double)(self->times[m - 1] - self->times[0]) / 1e9;
    result = Py_BuildValue("(Odd)", list, total_s, hi / 1e9);
done:
    Py_XDECREF(list);
    Py_DECREF(seq);
    PyMem_Free(bounds);
    PyMem_Free(counts);
    return result;
}

static PyObject *
TokenLog_gaps_s(TokenLog *self, PyObject *arg)
{
    Py_ssize_t m;
    if (prefix_of(self, arg, &m) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 1; i < m; i++) {
        int64_t g = self->times[i] - self->times[i - 1];
        int64_t k = self->ks == NULL ? 1 : self->ks[i];
        double v = (k == 1 ? (double)g : (double)g / (double)k) / 1e9;
        for (int64_t j = 0; j < k; j++) {
            PyObject *f = PyFloat_FromDouble(v);
            if (f == NULL || PyList_Append(out, f) < 0) {
                Py_XDECREF(f);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(f);
        }
    }
    return out;
}

static Py_ssize_t
TokenLog_len(TokenLog *self)
{
    return self->n;
}

static int
TokenLog_init(TokenLog *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"clock_ns", NULL};
    PyObject *clock = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:TokenLog", kwlist, &clock)) {
        return -1;
    }
    if (clock != Py_None && !PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "TokenLog.clock_ns must be callable or None");
        return -1;
    }
    Py_XSETREF(self->clock, clock == Py_None ? NULL : Py_NewRef(clock));
    return 0;
}

static int
TokenLog_traverse(TokenLog *self, visitproc visit, void *arg)
{
    Py_VISIT(self->clock);
    Py_VISIT(self->prefix);
    Py_VISIT(self->suffix);
    return 0;
}

static int
TokenLog_clear(TokenLog *self)
{
    Py_CLEAR(self->clock);
    Py_CLEAR(self->prefix);
    Py_CLEAR(self->suffix);
    return 0;
}

static void
TokenLog_dealloc(TokenLog *self)
{
    PyObject_GC_UnTrack(self);
    TokenLog_clear(self);
    PyMem_Free(self->times);
    PyMem_Free(self->ks);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef TokenLog_methods[] = {
    {"commit", (PyCFunction)(void (*)(void))TokenLog_commit, METH_FASTCALL | METH_KEYWORDS,
     "commit(k=1, proposed=0): k output tokens committed now (proposed: draft tokens proposed for them)."},
    {"send", (PyCFunction)(void (*)(void))TokenLog_send, METH_FASTCALL | METH_KEYWORDS,
     "send(n=1): n output tokens handed to the transport for the client."},
    {"count_until", (PyCFunction)TokenLog_count_until, METH_O,
     "count_until(until_ns): commits left once those after until_ns (from the end) are dropped."},
    {"time_ns", (PyCFunction)TokenLog_time_ns, METH_O, "time_ns(i): the time of commit i, ns."},
    {"generated", (PyCFunction)TokenLog_generated, METH_O, "generated(m): tokens in the first m commits."},
    {"itl", (PyCFunction)(void (*)(void))TokenLog_itl, METH_FASTCALL,
     "itl(m, bounds_ns): token-weighted ITL counts per bucket (+Inf last), their sum and maximum, seconds."},
    {"gaps_s", (PyCFunction)TokenLog_gaps_s, METH_O, "gaps_s(m): token-weighted ITL gaps, seconds."},
    {"expect_plain", (PyCFunction)(void (*)(void))TokenLog_expect_plain, METH_FASTCALL,
     "expect_plain(prefix, suffix): the bytes around the text of the stream's plain content chunks (None: none)."},
    {"commit_plain", (PyCFunction)TokenLog_commit_plain, METH_O,
     "commit_plain(body): whether body is prefix + text + suffix, its text non-empty without a quote; "
     "then one token is committed now."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef TokenLog_members[] = {
    {"sent", T_LONGLONG, offsetof(TokenLog, sent), READONLY, "tokens handed to the transport"},
    {"proposed", T_LONGLONG, offsetof(TokenLog, proposed), READONLY, "draft tokens proposed"},
    {"invalid", T_LONGLONG, offsetof(TokenLog, invalid), READONLY, "calls ignored as invalid"},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods TokenLog_as_sequence = {
    .sq_length = (lenfunc)TokenLog_len,
};

static PyTypeObject TokenLogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "llmslo.telemetry._tokenlog_c.TokenLog",
    .tp_doc = "The commit times and token counts of one request (native).",
    .tp_basicsize = sizeof(TokenLog),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TokenLog_init,
    .tp_dealloc = (destructor)TokenLog_dealloc,
    .tp_traverse = (traverseproc)TokenLog_traverse,
    .tp_clear = (inquiry)TokenLog_clear,
    .tp_methods = TokenLog_methods,
    .tp_members = TokenLog_members,
    .tp_as_sequence = &TokenLog_as_sequence,
};

/* ---- summary_json: one request summary as a JSON line ------------------------------------------------------
 *
 * The summary sink's writer thread encodes every summary; json.dumps costs about 4 us for a summary's twenty
 * fields and 13 us more for 64 gaps (its float repr: about 250 ns each), paid once per request by every server
 * that keeps summaries. summary_json(row) writes the same JSON as json.dumps(row, separators=(",", ":")) for a
 * flat row (a dict of str keys to None, bool, int, float, str, or a list of those), byte for byte but for one
 * kind of float: a float x with 0 <= x < 1e6 that is a whole number of nanoseconds (n = round(x * 1e9) gives
 * n / 1e9 == x, as the token log's times and gaps are; not -0.0) is written as n's decimal with nine fraction digits,
 * trailing zeros cut (0.000015 where repr writes 1.5e-05). That text is the exact decimal of n / 10^9, and
 * parsing it rounds that same rational as the division did, so it reads back as x exactly (and it is the
 * shortest such text: below 1e6, two decimals of nine fraction digits lie further apart than a double's
 * spacing). Anything else json would write differently or could not write (NaN, a nested dict, a subclass, a
 * huge int) raises TypeError or ValueError, and the caller uses json itself. */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Out;

static int
out_reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap) {
        return 0;
    }
    Py_ssize_t cap = o->cap ? o->cap : 512;
    while (cap < o->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(o->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

static int
out_write(Out *o, const char *text, Py_ssize_t n)
{
    if (out_reserve(o, n) < 0) {
        return -1;
    }
    memcpy(o->data + o->len, text, (size_t)n);
    o->len += n;
    return 0;
}

/* json's own escaper (json.encoder.encode_basestring_ascii, in C where _json is built): imported on first use,
 * so that the token log never depends on it. */
static PyObject *escape_ascii = NULL;

/* A str as json.dumps writes it (ensure_ascii): printable ASCII without a quote or a backslash, the usual key
 * or value of a summary, is copied; anything else is written by json's own escaper. */
static int
write_string(Out *o, PyObject *text)
{
    if (PyUnicode_IS_ASCII(text)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(text);
        const Py_UCS1 *chars = PyUnicode_1BYTE_DATA(text);
        Py_ssize_t i = 0;
        while (i < n && chars[i] >= ' ' && chars[i] <= '~' && chars[i] != '"' && chars[i] != '\\') {
            i++;
        }
        if (i == n) {
            if (n > PY_SSIZE_T_MAX - 2 || out_reserve(o, n + 2) < 0) {
                return -1;
            }
            o->data[o->len] = '"';
            memcpy(o->data + o->len + 1, chars, (size_t)n);
            o->data[o->len + n + 1] = '"';
            o->len += n + 2;
            return 0;
        }
    }
    if (escape_ascii == NULL) {
        PyObject *encoder = PyImport_ImportModule("json.encoder");
        if (encoder == NULL) {
            return -1;
        }
        escape_ascii = PyObject_GetAttrString(encoder, "encode_basestring_ascii");
        Py_DECREF(encoder);
        if (escape_ascii == NULL) {
            return -1;
        }
    }
    PyObject *escaped = PyObject_CallOneArg(escape_ascii, text);
    if (escaped == NULL) {
        return -1;
    }
    Py_ssize_t len;
    const char *utf8 = PyUnicode_Check(escaped) ? PyUnicode_AsUTF8AndSize(escaped, &len) : NULL;
    int status = utf8 == NULL ? -1 : out_write(o, utf8, len);
    if (utf8 == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_TypeError, "summary_json: json's escaper returned no str");
    }
    Py_DECREF(escaped);
    return status;
}

#define FLOAT_TEXT_MAX 32   /* the longest text of one float: repr of a double is at most 24 characters */

static int
write_float(Out *o, double x)
{
    if (!isfinite(x)) {
        PyErr_SetString(PyExc_ValueError, "summary_json: a float that is not finite (json writes NaN)");
        return -1;
    }
    if (out_reserve(o, FLOAT_TEXT_MAX) < 0) {
        return -1;
    }
    char *p = o->data + o->len;
    if (!signbit(x) && x < 1e6) {   /* not -0.0, which json writes with its sign */
        long long n = llround(x * 1e9);
        if ((double)n / 1e9 == x) {
            long long frac = n % 1000000000LL;
            int pos = snprintf(p, FLOAT_TEXT_MAX, "%lld.", n / 1000000000LL);
            char digits[9];
            for (int i = 8; i >= 0; i--) {
                digits[i] = (char)('0' + frac % 10);
                frac /= 10;
            }
            int keep = 9;
            while (keep > 1 && digits[keep - 1] == '0') {
                keep--;
            }
            memcpy(p + pos, digits, (size_t)keep);
            o->len += pos + keep;
            return 0;
        }
    }
    char *text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) {
        return -1;
    }
    size_t len = strlen(text);
    int fits = len < FLOAT_TEXT_MAX;
    if (fits) {
        memcpy(p, text, len);
        o->len += (Py_ssize_t)len;
    }
    PyMem_Free(text);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "summary_json: a float too long to write");
        return -1;
    }
    return 0;
}

/* A scalar: None, bool, int (within 64 bits), float, str; lists only where `list_ok`. */
static int
write_value(Out *o, PyObject *v, int list_ok)
{
    if (v == Py_None) {
        return out_write(o, "null", 4);
    }
    if (v == Py_True) {
        return out_write(o, "true", 4);
    }
    if (v == Py_False) {
        return out_write(o, "false", 5);
    }
    if (PyFloat_CheckExact(v)) {
        return write_float(o, PyFloat_AS_DOUBLE(v));
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (n == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "summary_json: an int beyond 64 bits");
            return -1;
        }
        char text[24];
        int len = snprintf(text, sizeof text, "%lld", n);
        return out_write(o, text, len);
    }
    if (PyUnicode_CheckExact(v)) {
        return write_string(o, v);
    }
    if (list_ok && PyList_CheckExact(v)) {
        if (out_write(o, "[", 1) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            if ((i && out_write(o, ",", 1) < 0) || write_value(o, PyList_GET_ITEM(v, i), 0) < 0) {
                return -1;
            }
        }
        return out_write(o, "]", 1);
    }
    PyErr_Format(PyExc_TypeError, "summary_json: a value of type %.100s", Py_TYPE(v)->tp_name);
    return -1;
}

static PyObject *
summary_json(PyObject *module, PyObject *row)
{
    (void)module;
    if (!PyDict_CheckExact(row)) {
        PyErr_SetString(PyExc_TypeError, "summary_json: expected a dict");
        return NULL;
    }
    Out o = {NULL, 0, 0};
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    int first = 1;
    if (out_write(&o, "{", 1) < 0) {
        goto fail;
    }
    while (PyDict_Next(row, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "summary_json: a key that is not a str");
            goto fail;
        }
        if ((!first && out_write(&o, ",", 1) < 0) || write_string(&o, key) < 0 || out_write(&o, ":", 1) < 0) {
            goto fail;
        }
        first = 0;
        /* the values are plain objects: nothing here runs Python code that could change the dict */
        if (write_value(&o, value, 1) < 0) {
            goto fail;
        }
    }
    if (out_write(&o, "}", 1) < 0) {
        goto fail;
    }
    PyObject *text = PyUnicode_DecodeASCII(o.data, o.len, NULL);
    PyMem_Free(o.data);
    return text;
fail:
    PyMem_Free(o.data);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"summary_json", (PyCFunction)summary_json, METH_O,
     "summary_json(row): a flat summary row as json.dumps(row, separators=(',', ':')) writes it, its floats of "
     "whole nanoseconds from that integer; TypeError or ValueError for what it does not write."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "llmslo.telemetry._tokenlog_c",
    .m_doc = "The native token log of llmslo.telemetry (see _tokenlog.py for the contract).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__tokenlog_c(void)
{
    if (PyType_Ready(&TokenLogType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "TokenLog", (PyObject *)&TokenLogType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
