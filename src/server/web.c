/* The chat page's files, served at their paths (and index.html at "/") with headers that keep the
 * page to this server: a content security policy that allows scripts, styles and connections to
 * this origin only (no inline scripts, so text a model writes can never run even if it got past
 * the page's escaping), and no content-type sniffing. */
#include <string.h>

#include "internal.h"
#include "web_assets.h"

const em_web_asset *em_web_asset_find(const char *url) {
    size_t n = strcspn(url, "?#");
    if (n == 1 && url[0] == '/') url = "/index.html", n = strlen(url);
    for (int i = 0; i < em_web_asset_count; i++)
        if (strlen(em_web_assets[i].path) == n && !strncmp(em_web_assets[i].path, url, n)) return &em_web_assets[i];
    return NULL;
}

struct MHD_Response *em_server_asset_response(const char *url) {
    const em_web_asset *asset = em_web_asset_find(url);
    if (!asset) return NULL;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(asset->size, (void *)asset->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return NULL;
    MHD_add_response_header(r, "Content-Type", asset->content_type);
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                            "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return r;
}
