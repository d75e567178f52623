// Interop probe: does the same envelope crypto as Aiven's plugin, with BouncyCastle
// (the provider Aiven uses), so the Python side can be checked against it.
//   wrap   <public.pem> <dek-hex>                      -> base64 RSA-OAEP(SHA3-512, MGF1 SHA3-512)
//   unwrap <private-pkcs8.pem> <base64>                -> dek hex
//   seal   <dek-hex> <aad-hex> <plain-hex>             -> hex IV(12)||ciphertext||tag(16)
//   open   <dek-hex> <aad-hex> <sealed-hex>            -> plain hex
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.SecureRandom;
import java.security.Security;
import java.security.spec.PKCS8EncodedKeySpec;
import java.security.spec.X509EncodedKeySpec;
import java.util.Base64;
import java.util.HexFormat;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;
import org.bouncycastle.jce.provider.BouncyCastleProvider;

public class BcEnvelope {
    static final String RSA = "RSA/NONE/OAEPWithSHA3-512AndMGF1Padding";

    static byte[] pem(String file) throws Exception {
        String text = Files.readString(Path.of(file)).replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        return Base64.getDecoder().decode(text);
    }

    public static void main(String[] a) throws Exception {
        Security.addProvider(new BouncyCastleProvider());
        HexFormat hex = HexFormat.of();
        switch (a[0]) {
            case "wrap" -> {
                var key = KeyFactory.getInstance("RSA").generatePublic(new X509EncodedKeySpec(pem(a[1])));
                Cipher c = Cipher.getInstance(RSA, "BC");
                c.init(Cipher.ENCRYPT_MODE, key, new SecureRandom());
                System.out.println(Base64.getEncoder().encodeToString(c.doFinal(hex.parseHex(a[2]))));
            }
            case "unwrap" -> {
                var key = KeyFactory.getInstance("RSA").generatePrivate(new PKCS8EncodedKeySpec(pem(a[1])));
                Cipher c = Cipher.getInstance(RSA, "BC");
                c.init(Cipher.DECRYPT_MODE, key);
                System.out.println(hex.formatHex(c.doFinal(Base64.getDecoder().decode(a[2]))));
            }
            case "seal" -> {
                Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
                c.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(hex.parseHex(a[1]), "AES"), new SecureRandom());
                c.updateAAD(hex.parseHex(a[2]));
                byte[] ct = c.doFinal(hex.parseHex(a[3]));
                System.out.println(hex.formatHex(c.getIV()) + hex.formatHex(ct));
            }
            case "open" -> {
                byte[] sealed = hex.parseHex(a[3]);
                Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
                c.init(Cipher.DECRYPT_MODE, new SecretKeySpec(hex.parseHex(a[1]), "AES"),
                       new GCMParameterSpec(128, sealed, 0, 12));
                c.updateAAD(hex.parseHex(a[2]));
                System.out.println(hex.formatHex(c.doFinal(sealed, 12, sealed.length - 12)));
            }
            default -> throw new IllegalArgumentException(a[0]);
        }
    }
}
