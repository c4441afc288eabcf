/*
 * Wine 8.0 (Debian 12) lacks bcryptprimitives.dll, from which Rust's standard library imports
 * ProcessPrng for its random seeds; without it every Rust test binary fails to load under Wine.
 * This stand-in exports ProcessPrng and fills the buffer from advapi32's RtlGenRandom
 * (exported as SystemFunction036). It is built and used only by .ci/run for the Wine tests.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
