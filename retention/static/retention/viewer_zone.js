'use strict';
// Tells the server the viewer's time zone (the browser's IANA name) in the
// ``viewer_zone`` cookie, which retention.middleware.ViewerTimeZone reads:
// the pages that follow render their times in that zone, the zone named. The
// page that set it first stays as it came (never reloaded: it may hold a form
// being filled in); its times name the zone they are in. Loaded by the admin
// (templates/admin/base_site.html) and the console (console/base.html).
(function() {
    var zone;
    try {
        zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    } catch (e) {
        return;
    }
    // IANA names only ("America/New_York", "Etc/GMT+5"): nothing else goes into the cookie.
    if (!zone || !/^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone)) {
        return;
    }
    var current = (document.cookie.match(/(?:^|;\s*)viewer_zone=([^;]*)/) || [])[1];
    if (current !== zone) {
        document.cookie = 'viewer_zone=' + zone + '; path=/; max-age=31536000; SameSite=Lax';
    }
})();
